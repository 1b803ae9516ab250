// Package bridge is the GuestWebhookBridge's model of the guest: which APIServices and
// webhooks a bridge selects (targets), what guestnet recorded on them when it rewrote them,
// how a target is rewritten and restored, and the plan of Services that makes a bridged
// target reachable from the host network. Everything here is pure: the controller reads the
// guest and the host, asks for a plan, and writes it.
package bridge

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// Target is one way the guest apiserver calls out: an APIService, or one webhook of a
// validating or mutating webhook configuration.
type Target struct {
	Kind    guestnetv1.TargetKind
	Name    string
	Webhook string

	// Found is false for a target named in the spec that the guest does not hold (yet).
	Found bool
	// Service is the guest Service the target references now; nil when a webhook has a url,
	// or an APIService is served by the guest apiserver itself.
	Service *ServiceRef
	// URL is a webhook's clientConfig.url, when it has one.
	URL string
	// CABundle verifies the target's serving certificate (clientConfig.caBundle, or the
	// APIService's spec.caBundle).
	CABundle []byte
	// InsecureSkipTLSVerify is the APIService's: the aggregator does not verify the server.
	InsecureSkipTLSVerify bool
	// FailurePolicy and TimeoutSeconds are a webhook's, as the configuration has them.
	FailurePolicy  *admissionregistrationv1.FailurePolicyType
	TimeoutSeconds *int32
	// Record is what guestnet recorded on the object for this target, if anything.
	Record *Record
	// Available is an APIService's Available condition (nil before the aggregator's first check).
	Available *apiregistrationv1.APIServiceCondition
}

// Key identifies a target within a guest cluster: "<kind>/<name>[/<webhook>]".
func (t Target) Key() string {
	if t.Webhook == "" {
		return string(t.Kind) + "/" + t.Name
	}
	return string(t.Kind) + "/" + t.Name + "/" + t.Webhook
}

// IsWebhook reports whether the target is a webhook (not an APIService).
func (t Target) IsWebhook() bool { return t.Kind != guestnetv1.APIServiceTarget }

// String names the target for messages: `APIService v1beta1.metrics.k8s.io`,
// `ValidatingWebhookConfiguration cert-manager-webhook, webhook webhook.cert-manager.io`.
func (t Target) String() string {
	if t.Webhook == "" {
		return string(t.Kind) + " " + t.Name
	}
	return string(t.Kind) + " " + t.Name + ", webhook " + t.Webhook
}

// ServiceRef is the guest Service (and port, and path for webhooks) a target calls.
type ServiceRef struct {
	Namespace string
	Name      string
	Port      int32
	Path      string
}

// String is "<namespace>/<name>:<port>".
func (r ServiceRef) String() string { return fmt.Sprintf("%s/%s:%d", r.Namespace, r.Name, r.Port) }

// Record is what guestnet stores on a guest object, in the same write as the rewrite, for
// each target it rewrote: which bridge did it, the original service reference exactly as the
// object held it, and what guestnet wrote in its place (to tell its own value from a later
// change by someone else).
type Record struct {
	// Bridge is the GuestWebhookBridge, "<namespace>/<name>" in the host.
	Bridge string `json:"bridge"`
	// Original is the original clientConfig.service (webhooks) or spec.service (APIServices).
	Original json.RawMessage `json:"original"`
	// Written is the url (webhooks) or the "<namespace>/<name>:<port>" service (APIServices)
	// guestnet wrote.
	Written string `json:"written"`
}

// Observed is what the guest holds that targets are selected from.
type Observed struct {
	APIServices        []apiregistrationv1.APIService
	ValidatingWebhooks []admissionregistrationv1.ValidatingWebhookConfiguration
	MutatingWebhooks   []admissionregistrationv1.MutatingWebhookConfiguration
}

// Select returns the targets spec selects from what the guest holds, sorted by key: every
// object named (a Found=false target for each name the guest lacks), every object the label
// selector matches, and, with all, every object that references a Service or that
// guestnet rewrote. A selected webhook configuration contributes all of its webhooks.
func Select(spec *guestnetv1.GuestWebhookBridgeSpec, obs Observed) ([]Target, error) {
	var targets []Target
	apiServiceObjs := make([]*apiregistrationv1.APIService, 0, len(obs.APIServices))
	for i := range obs.APIServices {
		apiServiceObjs = append(apiServiceObjs, &obs.APIServices[i])
	}
	apiServices, err := selectObjects(spec.APIServices, guestnetv1.APIServiceTarget, apiServiceObjs,
		func(a *apiregistrationv1.APIService) bool { return a.Spec.Service != nil || hasRecord(a) })
	if err != nil {
		return nil, err
	}
	for _, sel := range apiServices {
		if sel.obj == nil {
			targets = append(targets, Target{Kind: guestnetv1.APIServiceTarget, Name: sel.name})
			continue
		}
		t, err := APIServiceTarget(sel.obj)
		if err != nil {
			return nil, err
		}
		targets = append(targets, t)
	}
	for _, kind := range []guestnetv1.TargetKind{guestnetv1.ValidatingWebhookTarget, guestnetv1.MutatingWebhookTarget} {
		configs, err := selectConfigs(spec, kind, obs)
		if err != nil {
			return nil, err
		}
		for _, sel := range configs {
			if sel.obj == nil {
				targets = append(targets, Target{Kind: kind, Name: sel.name})
				continue
			}
			ts, err := WebhookTargets(sel.obj)
			if err != nil {
				return nil, err
			}
			targets = append(targets, ts...)
		}
	}
	slices.SortFunc(targets, func(a, b Target) int { return strings.Compare(a.Key(), b.Key()) })
	return targets, nil
}

func selectConfigs(spec *guestnetv1.GuestWebhookBridgeSpec, kind guestnetv1.TargetKind, obs Observed) ([]selected[client.Object], error) {
	referencesService := func(o client.Object) bool {
		if hasRecord(o) {
			return true
		}
		return slices.ContainsFunc(webhooksOf(o), func(w webhook) bool { return w.config.Service != nil })
	}
	if kind == guestnetv1.ValidatingWebhookTarget {
		objs := make([]client.Object, 0, len(obs.ValidatingWebhooks))
		for i := range obs.ValidatingWebhooks {
			objs = append(objs, &obs.ValidatingWebhooks[i])
		}
		return selectObjects(spec.ValidatingWebhooks, kind, objs, referencesService)
	}
	objs := make([]client.Object, 0, len(obs.MutatingWebhooks))
	for i := range obs.MutatingWebhooks {
		objs = append(objs, &obs.MutatingWebhooks[i])
	}
	return selectObjects(spec.MutatingWebhooks, kind, objs, referencesService)
}

// selected is one object a selector picked; obj is nil for a name the guest lacks.
type selected[T any] struct {
	name string
	obj  T
}

// selectObjects applies a TargetSelector to objects of one kind.
func selectObjects[T metav1.Object](sel *guestnetv1.TargetSelector, kind guestnetv1.TargetKind, objs []T, referencesService func(T) bool) ([]selected[T], error) {
	if sel == nil {
		return nil, nil
	}
	var selector labels.Selector
	if sel.Selector != nil {
		s, err := metav1.LabelSelectorAsSelector(sel.Selector)
		if err != nil {
			return nil, fmt.Errorf("%s selector: %w", kind, err)
		}
		selector = s
	}
	var out []selected[T]
	seen := map[string]bool{}
	for _, o := range objs {
		if slices.Contains(sel.Names, o.GetName()) ||
			(selector != nil && selector.Matches(labels.Set(o.GetLabels()))) ||
			(sel.All && referencesService(o)) {
			out = append(out, selected[T]{name: o.GetName(), obj: o})
			seen[o.GetName()] = true
		}
	}
	for _, name := range sel.Names {
		if !seen[name] {
			var none T
			out = append(out, selected[T]{name: name, obj: none})
		}
	}
	return out, nil
}

// hasRecord reports whether guestnet recorded a rewrite on obj.
func hasRecord(obj metav1.Object) bool {
	_, ok := obj.GetAnnotations()[guestnetv1.BridgeOriginalAnnotation]
	return ok
}

// APIServiceTarget is the target of an APIService.
func APIServiceTarget(a *apiregistrationv1.APIService) (Target, error) {
	t := Target{
		Kind:                  guestnetv1.APIServiceTarget,
		Name:                  a.Name,
		Found:                 true,
		CABundle:              a.Spec.CABundle,
		InsecureSkipTLSVerify: a.Spec.InsecureSkipTLSVerify,
	}
	if s := a.Spec.Service; s != nil {
		t.Service = &ServiceRef{Namespace: s.Namespace, Name: s.Name, Port: ptr.Deref(s.Port, 443)}
	}
	for i := range a.Status.Conditions {
		if a.Status.Conditions[i].Type == apiregistrationv1.Available {
			t.Available = &a.Status.Conditions[i]
		}
	}
	records, err := readRecords(a)
	if err != nil {
		return Target{}, err
	}
	if r, ok := records[a.Name]; ok {
		t.Record = &r
	}
	return t, nil
}

// WebhookTargets are the targets of a webhook configuration, one per webhook.
func WebhookTargets(obj client.Object) ([]Target, error) {
	kind := kindOf(obj)
	records, err := readRecords(obj)
	if err != nil {
		return nil, err
	}
	var targets []Target
	for _, w := range webhooksOf(obj) {
		t := Target{
			Kind:           kind,
			Name:           obj.GetName(),
			Webhook:        w.name,
			Found:          true,
			URL:            ptr.Deref(w.config.URL, ""),
			CABundle:       w.config.CABundle,
			FailurePolicy:  w.failurePolicy,
			TimeoutSeconds: w.timeoutSeconds,
		}
		if s := w.config.Service; s != nil {
			t.Service = &ServiceRef{Namespace: s.Namespace, Name: s.Name, Port: ptr.Deref(s.Port, 443), Path: ptr.Deref(s.Path, "")}
		}
		if r, ok := records[w.name]; ok {
			t.Record = &r
		}
		targets = append(targets, t)
	}
	return targets, nil
}

func kindOf(obj client.Object) guestnetv1.TargetKind {
	if _, ok := obj.(*admissionregistrationv1.MutatingWebhookConfiguration); ok {
		return guestnetv1.MutatingWebhookTarget
	}
	return guestnetv1.ValidatingWebhookTarget
}

// webhook gives access to one webhook of either configuration kind.
type webhook struct {
	name           string
	config         *admissionregistrationv1.WebhookClientConfig
	failurePolicy  *admissionregistrationv1.FailurePolicyType
	timeoutSeconds *int32
}

func webhooksOf(obj client.Object) []webhook {
	var out []webhook
	switch c := obj.(type) {
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		for i := range c.Webhooks {
			w := &c.Webhooks[i]
			out = append(out, webhook{name: w.Name, config: &w.ClientConfig, failurePolicy: w.FailurePolicy, timeoutSeconds: w.TimeoutSeconds})
		}
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		for i := range c.Webhooks {
			w := &c.Webhooks[i]
			out = append(out, webhook{name: w.Name, config: &w.ClientConfig, failurePolicy: w.FailurePolicy, timeoutSeconds: w.TimeoutSeconds})
		}
	}
	return out
}

// readRecords decodes BridgeOriginalAnnotation: records by webhook name (by the APIService's
// own name for an APIService).
func readRecords(obj metav1.Object) (map[string]Record, error) {
	value, ok := obj.GetAnnotations()[guestnetv1.BridgeOriginalAnnotation]
	if !ok {
		return nil, nil
	}
	records := map[string]Record{}
	if err := json.Unmarshal([]byte(value), &records); err != nil {
		return nil, fmt.Errorf("annotation %s of %s is not guestnet's (%w): remove it to let guestnet bridge the object again",
			guestnetv1.BridgeOriginalAnnotation, obj.GetName(), err)
	}
	return records, nil
}

// writeRecords stores records in BridgeOriginalAnnotation, or removes it when there are none.
func writeRecords(obj metav1.Object, records map[string]Record) error {
	annotations := obj.GetAnnotations()
	if len(records) == 0 {
		delete(annotations, guestnetv1.BridgeOriginalAnnotation)
		if len(annotations) == 0 {
			annotations = nil // as the object was before guestnet added the record
		}
		obj.SetAnnotations(annotations)
		return nil
	}
	value, err := json.Marshal(records) // map keys are sorted: the same records give the same bytes
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
