package bridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// Every record exists twice: on the guest object (BridgeOriginalAnnotation, written in the
// same patch as the rewrite) and in the bridge's status.records (the host copy, written
// before the guest object). Either copy is re-derived from the other, so a user removing or
// editing the annotation loses nothing, and a record that cannot be read in one copy is
// taken from the other. Only a target whose two copies are both unreadable (or both gone)
// is left alone, and only that target (RecordUnreadable).

// Record is what guestnet replaced in one target: which bridge did it, the original service
// reference exactly as the object held it, and what guestnet wrote in its place (to tell its
// own value from a later change by someone else).
type Record struct {
	// Bridge is the GuestWebhookBridge, "<namespace>/<name>" in the host.
	Bridge string `json:"bridge"`
	// Original is the original clientConfig.service (webhooks) or spec.service (APIServices).
	Original json.RawMessage `json:"original"`
	// Written is the url (webhooks) or the "<namespace>/<name>:<port>" service (APIServices)
	// guestnet wrote.
	Written string `json:"written"`
}

// Equal reports whether two records say the same.
func (r *Record) Equal(o *Record) bool {
	if r == nil || o == nil {
		return r == o
	}
	return r.Bridge == o.Bridge && r.Written == o.Written && bytes.Equal(compactJSON(r.Original), compactJSON(o.Original))
}

// validate checks that a decoded record can be used: a bridge, a written value, and an
// original that is a JSON object.
func (r *Record) validate() error {
	var original map[string]any
	switch {
	case r.Bridge == "":
		return errors.New("it names no bridge")
	case r.Written == "":
		return errors.New("it has no written value")
	case json.Unmarshal(r.Original, &original) != nil || original == nil:
		return errors.New("its original is not a service reference")
	}
	return nil
}

func compactJSON(raw json.RawMessage) []byte {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return raw
	}
	return b.Bytes()
}

// recordSet is the record annotation of one guest object: one entry per webhook (per
// APIService name for an APIService). Entries are kept as they are stored, so that changing
// one leaves the others, readable or not, exactly as they were.
type recordSet struct {
	entries map[string]json.RawMessage
	// unreadable is set when the annotation as a whole is not a JSON object: then no entry
	// can be read, and writing one replaces the annotation.
	unreadable error
}

func readRecordSet(obj metav1.Object) recordSet {
	value, ok := obj.GetAnnotations()[guestnetv1.BridgeOriginalAnnotation]
	if !ok {
		return recordSet{}
	}
	var entries map[string]json.RawMessage
	if err := json.Unmarshal([]byte(value), &entries); err != nil || entries == nil {
		if err == nil {
			err = errors.New("it is null")
		}
		return recordSet{unreadable: fmt.Errorf("annotation %s of %s is not guestnet's JSON (%w)", guestnetv1.BridgeOriginalAnnotation, obj.GetName(), err)}
	}
	return recordSet{entries: entries}
}

// get returns the entry for key: nil when there is none, an error when it cannot be read.
func (s recordSet) get(key string) (*Record, error) {
	if s.unreadable != nil {
		return nil, s.unreadable
	}
	raw, ok := s.entries[key]
	if !ok {
		return nil, nil
	}
	r := &Record{}
	if err := json.Unmarshal(raw, r); err != nil {
		return nil, fmt.Errorf("the entry %q of annotation %s is not guestnet's JSON (%w)", key, guestnetv1.BridgeOriginalAnnotation, err)
	}
	if err := r.validate(); err != nil {
		return nil, fmt.Errorf("the entry %q of annotation %s is damaged: %w", key, guestnetv1.BridgeOriginalAnnotation, err)
	}
	return r, nil
}

func (s *recordSet) set(key string, r Record) error {
	raw, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if s.entries == nil || s.unreadable != nil {
		s.entries, s.unreadable = map[string]json.RawMessage{}, nil
	}
	s.entries[key] = raw
	return nil
}

func (s *recordSet) remove(key string) {
	if s.unreadable == nil {
		delete(s.entries, key)
	}
}

// write stores the set in obj's annotation, or removes the annotation when it is empty. An
// unreadable annotation nobody replaced stays as it is.
func (s recordSet) write(obj metav1.Object) error {
	if s.unreadable != nil {
		return nil
	}
	annotations := obj.GetAnnotations()
	if len(s.entries) == 0 {
		delete(annotations, guestnetv1.BridgeOriginalAnnotation)
		if len(annotations) == 0 {
			annotations = nil // as the object was before guestnet added the record
		}
		obj.SetAnnotations(annotations)
		return nil
	}
	value, err := json.Marshal(s.entries) // map keys are sorted: the same records give the same bytes
	if err != nil {
		return err
	}
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[guestnetv1.BridgeOriginalAnnotation] = string(value)
	obj.SetAnnotations(annotations)
	return nil
}

// hasRecord reports whether obj carries a record annotation (readable or not).
func hasRecord(obj metav1.Object) bool {
	_, ok := obj.GetAnnotations()[guestnetv1.BridgeOriginalAnnotation]
	return ok
}

// HostRecords is the host copy of one bridge's records (its status.records), by target key.
type HostRecords struct {
	records    map[string]Record
	unreadable map[string]error
	// status keeps every entry as status holds it, so that an entry that cannot be read is
	// kept as it is.
	status map[string]guestnetv1.BridgeRecord
}

// ReadHostRecords decodes status.records of the bridge me ("<namespace>/<name>").
func ReadHostRecords(me string, status []guestnetv1.BridgeRecord) HostRecords {
	h := HostRecords{records: map[string]Record{}, unreadable: map[string]error{}, status: map[string]guestnetv1.BridgeRecord{}}
	for _, s := range status {
		key := Target{Kind: s.Kind, Name: s.Name, Webhook: s.Webhook}.Key()
		h.status[key] = s
		r := Record{Bridge: me, Original: json.RawMessage(s.Original), Written: s.Written}
		if err := r.validate(); err != nil {
			h.unreadable[key] = fmt.Errorf("its entry in status.records is damaged: %w", err)
			continue
		}
		h.records[key] = r
	}
	return h
}

// Lookup returns the host copy of the record of the target key: nil when there is none, an
// error when it cannot be read.
func (h HostRecords) Lookup(key string) (*Record, error) {
	if err := h.unreadable[key]; err != nil {
		return nil, err
	}
	if r, ok := h.records[key]; ok {
		return &r, nil
	}
	return nil, nil
}

// Has reports whether the host copy has an entry (readable or not) for the target key.
func (h HostRecords) Has(key string) bool {
	_, ok := h.status[key]
	return ok
}

// Keys are the target keys of every entry, sorted.
func (h HostRecords) Keys() []string { return sortedKeys(h.status) }

// Len is the number of entries.
func (h HostRecords) Len() int { return len(h.status) }

// Entry is the entry of key as status holds it.
func (h HostRecords) Entry(key string) (guestnetv1.BridgeRecord, bool) {
	s, ok := h.status[key]
	return s, ok
}

// hostRecord is the status.records entry of a record of target t.
func hostRecord(t Target, r Record) guestnetv1.BridgeRecord {
	return guestnetv1.BridgeRecord{Kind: t.Kind, Name: t.Name, Webhook: t.Webhook, Original: string(compactJSON(r.Original)), Written: r.Written}
}

// HostRecordsStatus is status.records holding entries, sorted by target.
func HostRecordsStatus(entries map[string]guestnetv1.BridgeRecord) []guestnetv1.BridgeRecord {
	out := make([]guestnetv1.BridgeRecord, 0, len(entries))
	for _, key := range sortedKeys(entries) {
		out = append(out, entries[key])
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// DescribeRecord says, for events and logs, what a record left in the guest.
func DescribeRecord(r guestnetv1.BridgeRecord) string {
	t := Target{Kind: r.Kind, Name: r.Name, Webhook: r.Webhook}
	what := "url " + r.Written
	if !t.IsWebhook() {
		what = "service " + r.Written
	}
	return fmt.Sprintf("%s (%s instead of the original service %s)", t, what, strings.TrimSpace(r.Original))
}

// SameHostRecords reports whether two sets of status.records entries are the same.
func SameHostRecords(a, b map[string]guestnetv1.BridgeRecord) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// NewRecord is the record of a first rewrite of t by bridge, to written: its original is the
// service reference t holds now.
func NewRecord(t Target, bridge, written string) Record {
	return Record{Bridge: bridge, Original: t.original, Written: written}
}
