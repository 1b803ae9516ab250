package bridge

import (
	"encoding/json"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Rewrites and restores. Each changes a copy of the object in memory only; GuestPatch turns
// the difference into the one JSON patch that writes it, so the rewrite and its record (or the
// restore and the record's removal) land together or not at all. Nothing else in the object
// is touched: caBundle belongs to whoever injects it (cert-manager's cainjector),
// failurePolicy and timeoutSeconds to the user.

// RewriteWebhook points the webhook named webhookName of a webhook configuration at url,
// removes its service reference in the same change (the apiserver rejects both at once) and
// stores r as its record (replacing the entry for that webhook, whoever's it was). It
// reports whether obj changed.
func RewriteWebhook(obj client.Object, webhookName, url string, r Record) (bool, error) {
	w, ok := findWebhook(obj, webhookName)
	if !ok {
		return false, fmt.Errorf("%s has no webhook %s", obj.GetName(), webhookName)
	}
	changed := w.config.Service != nil || ptr.Deref(w.config.URL, "") != url
	w.config.Service = nil
	w.config.URL = ptr.To(url)
	recordChanged, err := setRecord(obj, webhookName, r)
	return changed || recordChanged, err
}

// RewriteAPIService points a at the guest Service ref (the bridge's ExternalName Service) and
// stores r as its record. caBundle and insecureSkipTLSVerify stay. It reports whether a changed.
func RewriteAPIService(a *apiregistrationv1.APIService, ref apiregistrationv1.ServiceReference, r Record) (bool, error) {
	changed := a.Spec.Service == nil || !sameAPIServiceRef(a.Spec.Service, ServiceRef{Namespace: ref.Namespace, Name: ref.Name, Port: ptr.Deref(ref.Port, 443)}.String())
	if changed {
		a.Spec.Service = ref.DeepCopy()
	}
	recordChanged, err := setRecord(a, a.Name, r)
	return changed || recordChanged, err
}

// RestoreWebhook puts back r's original service reference on the webhook named webhookName
// when the webhook still holds what r says guestnet wrote, and removes the record (r's
// bridge's entry, or an entry nobody can read). When the url is no longer the one guestnet
// wrote, someone else changed it since: only the record goes. It reports whether obj changed.
func RestoreWebhook(obj client.Object, webhookName string, r Record) (bool, error) {
	changed := false
	if w, found := findWebhook(obj, webhookName); found && r.Written != "" && w.config.Service == nil && ptr.Deref(w.config.URL, "") == r.Written {
		service := &admissionregistrationv1.ServiceReference{}
		if err := json.Unmarshal(r.Original, service); err != nil {
			return false, fmt.Errorf("record of %s webhook %s: %w", obj.GetName(), webhookName, err)
		}
		w.config.URL = nil
		w.config.Service = service
		changed = true
	}
	return dropRecord(obj, webhookName, r.Bridge) || changed, nil
}

// ForgetWebhook removes bridge's record of the webhook named webhookName without touching the
// webhook (someone else changed its url since guestnet wrote it: theirs now). It reports
// whether obj changed.
func ForgetWebhook(obj client.Object, webhookName, bridge string) bool {
	return dropRecord(obj, webhookName, bridge)
}

// RestoreAPIService puts back r's original service when a still references the service
// guestnet wrote, and removes the record; when a references another service, only the
// record goes. It reports whether a changed.
func RestoreAPIService(a *apiregistrationv1.APIService, r Record) (bool, error) {
	changed := false
	if a.Spec.Service != nil && sameAPIServiceRef(a.Spec.Service, r.Written) {
		original := &apiregistrationv1.ServiceReference{}
		if err := json.Unmarshal(r.Original, original); err != nil {
			return false, fmt.Errorf("record of APIService %s: %w", a.Name, err)
		}
		a.Spec.Service = original
		changed = true
	}
	return dropRecord(a, a.Name, r.Bridge) || changed, nil
}

// setRecord stores r as the record of key on obj and reports whether that changed anything.
func setRecord(obj client.Object, key string, r Record) (bool, error) {
	records := readRecordSet(obj)
	if old, err := records.get(key); err == nil && old.Equal(&r) {
		return false, nil
	}
	if err := records.set(key, r); err != nil {
		return false, err
	}
	return true, records.write(obj)
}

// dropRecord removes the record of key from obj when it is bridge's or cannot be read (the
// caller knows from the host copy that the target was bridge's), and reports whether obj
// changed.
func dropRecord(obj client.Object, key, bridge string) bool {
	records := readRecordSet(obj)
	if records.unreadable != nil {
		// Nothing in it can be read: the whole annotation goes (every bridge that wrote in
		// it keeps its records in its own host copy).
		records = recordSet{entries: map[string]json.RawMessage{}}
		_ = records.write(obj)
		return true
	}
	if _, ok := records.entries[key]; !ok {
		return false
	}
	if old, err := records.get(key); err == nil && old.Bridge != bridge {
		return false
	}
	records.remove(key)
	_ = records.write(obj) // only removes
	return true
}

// holds reports whether t holds exactly what r says guestnet wrote.
func holds(t Target, r *Record) bool {
	if r == nil {
		return false
	}
	if t.IsWebhook() {
		return t.Service == nil && t.URL != "" && t.URL == r.Written
	}
	return t.Service != nil && t.Service.String() == r.Written
}

func sameAPIServiceRef(ref *apiregistrationv1.ServiceReference, written string) bool {
	return ServiceRef{Namespace: ref.Namespace, Name: ref.Name, Port: ptr.Deref(ref.Port, 443)}.String() == written
}

func findWebhook(obj client.Object, name string) (webhook, bool) {
	for _, w := range webhooksOf(obj) {
		if w.name == name {
			return w, true
		}
	}
	return webhook{}, false
}

// Changes are the target plans that ask for a write on a guest object (rewrites, forgets and
// restores), grouped by object ("<kind>/<name>", in plan order).
func (p *Plan) Changes() (objects []string, byObject map[string][]*TargetPlan) {
	byObject = map[string][]*TargetPlan{}
	add := func(tp *TargetPlan) {
		key := string(tp.Kind) + "/" + tp.Name
		if _, ok := byObject[key]; !ok {
			objects = append(objects, key)
		}
		byObject[key] = append(byObject[key], tp)
	}
	for i := range p.Targets {
		if a := p.Targets[i].Action; a == RewriteAction || a == ForgetAction {
			add(&p.Targets[i])
		}
	}
	for i := range p.Restores {
		if p.Restores[i].Action == RestoreAction {
			add(&p.Restores[i])
		}
	}
	return objects, byObject
}

// Apply makes the changes of tps (Changes of one object) on obj, a copy of the observed
// object, and returns those that changed it.
func Apply(obj client.Object, tps []*TargetPlan, me string) ([]*TargetPlan, error) {
	var done []*TargetPlan
	for _, tp := range tps {
		var changed bool
		var err error
		switch {
		case tp.Action == RewriteAction && tp.IsWebhook():
			changed, err = RewriteWebhook(obj, tp.Webhook, tp.URL, *tp.Desired)
		case tp.Action == RewriteAction:
			changed, err = RewriteAPIService(obj.(*apiregistrationv1.APIService), *tp.APIServiceRef, *tp.Desired)
		case tp.Action == ForgetAction:
			changed = ForgetWebhook(obj, tp.Webhook, me)
		case tp.Action == RestoreAction && tp.IsWebhook():
			changed, err = RestoreWebhook(obj, tp.Webhook, *tp.Own)
		case tp.Action == RestoreAction:
			changed, err = RestoreAPIService(obj.(*apiregistrationv1.APIService), *tp.Own)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", tp.Target, err)
		}
		if changed {
			done = append(done, tp)
		}
	}
	return done, nil
}

// IsRewritten reports whether the target holds exactly what its guest record says guestnet
// wrote.
func IsRewritten(t Target) bool { return holds(t, t.Record) }
