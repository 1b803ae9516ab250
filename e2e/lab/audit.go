package lab

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// AuditRequest is one request as the apiserver's audit log records it (Metadata level).
type AuditRequest struct {
	Verb      string `json:"verb"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		APIGroup    string `json:"apiGroup"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestURI string `json:"requestURI"`
	// Received and Answered are when the apiserver received the request and when it had
	// answered it (the ResponseComplete stage; ResponseStarted for a watch).
	Received time.Time `json:"requestReceivedTimestamp"`
	Answered time.Time `json:"stageTimestamp"`
}

// Write is true for the verbs that change something (apply is a patch).
func (r AuditRequest) Write() bool {
	switch r.Verb {
	case "create", "update", "patch", "delete", "deletecollection":
		return true
	}
	return false
}

// Read is true for a get or a list of objects that is not a watch: what an informer's cache
// could have answered. Requests for non-resource URLs (the ClusterCache's health probe of
// "/", discovery) are not reads of objects.
func (r AuditRequest) Read() bool { return (r.Verb == "get" || r.Verb == "list") && r.ObjectRef != nil }

// Resource is "resource" or "resource/subresource" ("" for non-resource URLs).
func (r AuditRequest) Resource() string {
	if r.ObjectRef == nil {
		return ""
	}
	if r.ObjectRef.Subresource != "" {
		return r.ObjectRef.Resource + "/" + r.ObjectRef.Subresource
	}
	return r.ObjectRef.Resource
}

// String is "verb resource[/subresource] namespace/name".
func (r AuditRequest) String() string {
	if r.ObjectRef == nil {
		return r.Verb + " " + r.RequestURI
	}
	key := r.ObjectRef.Name
	if r.ObjectRef.Namespace != "" {
		key = r.ObjectRef.Namespace + "/" + key
	}
	return strings.TrimSpace(r.Verb + " " + r.Resource() + " " + key)
}

// AuditLog reads a control plane's audit log from a position on, so that a test can count
// the requests of one phase.
type AuditLog struct {
	path   string
	offset int64
	// midLine: the reader was opened while the apiserver was writing a line; that request
	// came before the reader, and its rest is skipped.
	midLine bool
}

// AuditLog returns a reader of the control plane's audit log positioned at its current end
// (the control plane must run with Audit).
func (cp *ControlPlane) AuditLog() (*AuditLog, error) {
	if !cp.Options.Audit {
		return nil, fmt.Errorf("%s control plane runs without an audit log", cp.Options.Name)
	}
	return openAuditLog(cp.AuditLogPath())
}

func openAuditLog(path string) (*AuditLog, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	a := &AuditLog{path: path, offset: st.Size()}
	if a.offset > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, a.offset-1); err != nil {
			return nil, err
		}
		a.midLine = last[0] != '\n'
	}
	return a, nil
}

// Next returns the requests logged since the last call (or since AuditLog), by user agents
// that start with userAgent. The apiserver logs in blocking mode: every request that has been
// answered is in the file.
func (a *AuditLog) Next(userAgent string) ([]AuditRequest, error) {
	f, err := os.Open(a.path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(a.offset, io.SeekStart); err != nil {
		return nil, err
	}
	var out []AuditRequest
	r := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := r.ReadBytes('\n')
		if err == io.EOF {
			break // a partial last line is read again next time
		}
		if err != nil {
			return nil, err
		}
		a.offset += int64(len(line))
		if a.midLine {
			a.midLine = false
			continue
		}
		var req AuditRequest
		if err := json.Unmarshal(line, &req); err != nil {
			return nil, fmt.Errorf("audit log %s: %w", a.path, err)
		}
		if strings.HasPrefix(req.UserAgent, userAgent) {
			out = append(out, req)
		}
	}
	return out, nil
}

// CountBy counts requests by key(request), skipping those for which key returns "".
func CountBy(reqs []AuditRequest, key func(AuditRequest) string) map[string]int {
	out := map[string]int{}
	for _, r := range reqs {
		if k := key(r); k != "" {
			out[k]++
		}
	}
	return out
}

// FormatCounts prints counts one "key: n" per line, sorted by key.
func FormatCounts(counts map[string]int) string {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-60s %d\n", k, counts[k])
	}
	return b.String()
}
