package bridge

import (
	"encoding/json"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Rewrites and restores. Each changes the object in memory only; the caller writes it back
// with one update, so the rewrite and its record (or the restore and the record's removal)
// land together or not at all. Nothing else in the object is touched: caBundle belongs to
// whoever injects it (cert-manager's cainjector), failurePolicy and timeoutSeconds to the user.

// RewriteWebhook points the webhook named webhookName of a webhook configuration at url and
// removes its service reference in the same change (the apiserver rejects both at once).
// When the webhook references a Service, that reference is recorded as the original, for
// bridge (it replaces an older record: a chart that put the service back owns the new
// original). It reports whether obj changed.
func RewriteWebhook(obj client.Object, webhookName, url, bridge string) (bool, error) {
	w, ok := findWebhook(obj, webhookName)
	if !ok {
		return false, fmt.Errorf("%s has no webhook %s", obj.GetName(), webhookName)
	}
	records, err := readRecords(obj)
	if err != nil {
		return false, err
	}
	if records == nil {
		records = map[string]Record{}
	}
	record, recorded := records[webhookName]
	if w.config.Service != nil {
		original, err := json.Marshal(w.config.Service)
		if err != nil {
			return false, err
		}
		record = Record{Bridge: bridge, Original: original}
	} else if !recorded || record.Bridge != bridge {
		return false, fmt.Errorf("%s webhook %s references no Service and was not rewritten by %s", obj.GetName(), webhookName, bridge)
	}
	if w.config.Service == nil && ptr.Deref(w.config.URL, "") == url && record.Written == url {
		return false, nil
	}
	record.Written = url
	records[webhookName] = record
	w.config.Service = nil
	w.config.URL = ptr.To(url)
	return true, writeRecords(obj, records)
}

// RestoreWebhook puts back the original service reference recorded for bridge on the webhook
// named webhookName, removes the url guestnet wrote and the record. When the webhook's url
// is no longer the one guestnet wrote, someone else changed it since: only the record goes.
// It reports whether obj changed.
func RestoreWebhook(obj client.Object, webhookName, bridge string) (bool, error) {
	records, err := readRecords(obj)
	if err != nil {
		return false, err
	}
	record, ok := records[webhookName]
	if !ok || record.Bridge != bridge {
		return false, nil
	}
	delete(records, webhookName)
	if w, found := findWebhook(obj, webhookName); found && w.config.Service == nil && ptr.Deref(w.config.URL, "") == record.Written {
		service := &admissionregistrationv1.ServiceReference{}
		if err := json.Unmarshal(record.Original, service); err != nil {
			return false, fmt.Errorf("record of %s webhook %s: %w", obj.GetName(), webhookName, err)
		}
		w.config.URL = nil
		w.config.Service = service
	}
	return true, writeRecords(obj, records)
}

// ForgetWebhook removes bridge's record of the webhook named webhookName without touching the
// webhook (someone else changed its url since guestnet wrote it: theirs now). It reports
// whether obj changed.
func ForgetWebhook(obj client.Object, webhookName, bridge string) (bool, error) {
	records, err := readRecords(obj)
	if err != nil {
		return false, err
	}
	if record, ok := records[webhookName]; !ok || record.Bridge != bridge {
		return false, nil
	}
	delete(records, webhookName)
	return true, writeRecords(obj, records)
}

// RewriteAPIService points a at the guest Service ref (the bridge's ExternalName Service),
// recording the service it referenced as the original, for bridge. caBundle and
// insecureSkipTLSVerify stay. It reports whether a changed.
func RewriteAPIService(a *apiregistrationv1.APIService, ref apiregistrationv1.ServiceReference, bridge string) (bool, error) {
	records, err := readRecords(a)
	if err != nil {
		return false, err
	}
	written := ServiceRef{Namespace: ref.Namespace, Name: ref.Name, Port: ptr.Deref(ref.Port, 443)}.String()
	record, recorded := records[a.Name]
	current := a.Spec.Service
	if current != nil && recorded && record.Bridge == bridge && sameAPIServiceRef(current, record.Written) {
		if record.Written == written {
			return false, nil
		}
	} else {
		if current == nil {
			return false, fmt.Errorf("APIService %s references no Service", a.Name)
		}
		// Not (or no longer) guestnet's value: what the object holds is the original.
		original, err := json.Marshal(current)
		if err != nil {
			return false, err
		}
		record = Record{Bridge: bridge, Original: original}
	}
	record.Written = written
	if records == nil {
		records = map[string]Record{}
	}
	records[a.Name] = record
	a.Spec.Service = ref.DeepCopy()
	return true, writeRecords(a, records)
}

// RestoreAPIService puts back the service a referenced before bridge rewrote it, and removes
// the record; when a references another service than the one guestnet wrote, only the
// record goes. It reports whether a changed.
func RestoreAPIService(a *apiregistrationv1.APIService, bridge string) (bool, error) {
	records, err := readRecords(a)
	if err != nil {
		return false, err
	}
	record, ok := records[a.Name]
	if !ok || record.Bridge != bridge {
		return false, nil
	}
	delete(records, a.Name)
	if a.Spec.Service != nil && sameAPIServiceRef(a.Spec.Service, record.Written) {
		original := &apiregistrationv1.ServiceReference{}
		if err := json.Unmarshal(record.Original, original); err != nil {
			return false, fmt.Errorf("record of APIService %s: %w", a.Name, err)
		}
		a.Spec.Service = original
	}
	return true, writeRecords(a, records)
}

// IsRewritten reports whether the target holds exactly what its record says guestnet wrote.
func IsRewritten(t Target) bool {
	if t.Record == nil || t.Service == nil && t.URL == "" {
		return false
	}
	if t.IsWebhook() {
		return t.Service == nil && t.URL == t.Record.Written
	}
	return t.Service != nil && t.Service.String() == t.Record.Written
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
