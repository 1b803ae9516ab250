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
	// Record is the guest copy of a record for this target (the object's annotation), if
	// there is one; RecordErr says why one that is there cannot be read.
	Record    *Record
	RecordErr error
	// Available is an APIService's Available condition (nil before the aggregator's first check).
	Available *apiregistrationv1.APIServiceCondition

	// original is the service reference the object holds now, as JSON: what a first rewrite
	// records.
	original json.RawMessage
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

// Observed is what the guest holds that targets are selected from.
type Observed struct {
	APIServices        []apiregistrationv1.APIService
	ValidatingWebhooks []admissionregistrationv1.ValidatingWebhookConfiguration
	MutatingWebhooks   []admissionregistrationv1.MutatingWebhookConfiguration
}

// Select returns the targets spec selects from what the guest holds, sorted by key: every
// object named (a Found=false target for each name the guest lacks), every object the label
// selector matches, and, with all, every object that references a Service or that
// guestnet rewrote (a record in its annotation or in host). A selected webhook configuration
// contributes all of its webhooks. The error is a selector that cannot be used.
func Select(spec *guestnetv1.GuestWebhookBridgeSpec, obs Observed, host HostRecords) ([]Target, error) {
	var targets []Target
	recorded := func(kind guestnetv1.TargetKind, o metav1.Object) bool {
		if hasRecord(o) {
			return true
		}
		prefix := Target{Kind: kind, Name: o.GetName()}.Key()
		return slices.ContainsFunc(host.Keys(), func(k string) bool { return k == prefix || strings.HasPrefix(k, prefix+"/") })
	}
	apiServiceObjs := make([]*apiregistrationv1.APIService, 0, len(obs.APIServices))
	for i := range obs.APIServices {
		apiServiceObjs = append(apiServiceObjs, &obs.APIServices[i])
	}
	apiServices, err := selectObjects(spec.APIServices, guestnetv1.APIServiceTarget, apiServiceObjs,
		func(a *apiregistrationv1.APIService) bool {
			return referencesService(a) || recorded(guestnetv1.APIServiceTarget, a)
		})
	if err != nil {
		return nil, err
	}
	for _, sel := range apiServices {
		if sel.obj == nil {
			targets = append(targets, Target{Kind: guestnetv1.APIServiceTarget, Name: sel.name})
			continue
		}
		targets = append(targets, APIServiceTarget(sel.obj))
	}
	for _, kind := range []guestnetv1.TargetKind{guestnetv1.ValidatingWebhookTarget, guestnetv1.MutatingWebhookTarget} {
		configs, err := selectConfigs(spec, kind, obs, func(o client.Object) bool { return recorded(kind, o) })
		if err != nil {
			return nil, err
		}
		for _, sel := range configs {
			if sel.obj == nil {
				targets = append(targets, Target{Kind: kind, Name: sel.name})
				continue
			}
			targets = append(targets, WebhookTargets(sel.obj)...)
		}
	}
	slices.SortFunc(targets, func(a, b Target) int { return strings.Compare(a.Key(), b.Key()) })
	return targets, nil
}

// AllTargets are the targets of every object the guest holds, selected or not.
func AllTargets(obs Observed) []Target {
	var out []Target
	for i := range obs.APIServices {
		out = append(out, APIServiceTarget(&obs.APIServices[i]))
	}
	for _, obj := range obs.webhookConfigurations() {
		out = append(out, WebhookTargets(obj)...)
	}
	return out
}

func (obs Observed) webhookConfigurations() []client.Object {
	var out []client.Object
	for i := range obs.ValidatingWebhooks {
		out = append(out, &obs.ValidatingWebhooks[i])
	}
	for i := range obs.MutatingWebhooks {
		out = append(out, &obs.MutatingWebhooks[i])
	}
	return out
}

// Object returns the observed object t belongs to, nil when the guest has none.
func (obs Observed) Object(t Target) client.Object {
	switch t.Kind {
	case guestnetv1.APIServiceTarget:
		for i := range obs.APIServices {
			if obs.APIServices[i].Name == t.Name {
				return &obs.APIServices[i]
			}
		}
	case guestnetv1.ValidatingWebhookTarget:
		for i := range obs.ValidatingWebhooks {
			if obs.ValidatingWebhooks[i].Name == t.Name {
				return &obs.ValidatingWebhooks[i]
			}
		}
	case guestnetv1.MutatingWebhookTarget:
		for i := range obs.MutatingWebhooks {
			if obs.MutatingWebhooks[i].Name == t.Name {
				return &obs.MutatingWebhooks[i]
			}
		}
	}
	return nil
}

func selectConfigs(spec *guestnetv1.GuestWebhookBridgeSpec, kind guestnetv1.TargetKind, obs Observed, recorded func(client.Object) bool) ([]selected[client.Object], error) {
	referencesServiceOrRecorded := func(o client.Object) bool { return recorded(o) || referencesService(o) }
	if kind == guestnetv1.ValidatingWebhookTarget {
		objs := make([]client.Object, 0, len(obs.ValidatingWebhooks))
		for i := range obs.ValidatingWebhooks {
			objs = append(objs, &obs.ValidatingWebhooks[i])
		}
		return selectObjects(spec.ValidatingWebhooks, kind, objs, referencesServiceOrRecorded)
	}
	objs := make([]client.Object, 0, len(obs.MutatingWebhooks))
	for i := range obs.MutatingWebhooks {
		objs = append(objs, &obs.MutatingWebhooks[i])
	}
	return selectObjects(spec.MutatingWebhooks, kind, objs, referencesServiceOrRecorded)
}

// referencesService reports whether the guest apiserver calls o through a guest Service: an
// APIService with spec.service, a webhook configuration with a webhook whose clientConfig
// names a service (spec selects these with all).
func referencesService(o client.Object) bool {
	if a, ok := o.(*apiregistrationv1.APIService); ok {
		return a.Spec.Service != nil
	}
	return slices.ContainsFunc(webhooksOf(o), func(w webhook) bool { return w.config.Service != nil })
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
		s, err := metav1.LabelSelectorAsSelector(LabelSelector(sel.Selector))
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

// LabelSelector is the metav1.LabelSelector a TargetLabelSelector stands for.
func LabelSelector(s *guestnetv1.TargetLabelSelector) *metav1.LabelSelector {
	out := &metav1.LabelSelector{}
	for k, v := range s.MatchLabels {
		if out.MatchLabels == nil {
			out.MatchLabels = map[string]string{}
		}
		out.MatchLabels[k] = string(v)
	}
	for _, e := range s.MatchExpressions {
		out.MatchExpressions = append(out.MatchExpressions, metav1.LabelSelectorRequirement{Key: e.Key, Operator: e.Operator, Values: e.Values})
	}
	return out
}

// APIServiceTarget is the target of an APIService.
func APIServiceTarget(a *apiregistrationv1.APIService) Target {
	t := Target{
		Kind:                  guestnetv1.APIServiceTarget,
		Name:                  a.Name,
		Found:                 true,
		CABundle:              a.Spec.CABundle,
		InsecureSkipTLSVerify: a.Spec.InsecureSkipTLSVerify,
	}
	if s := a.Spec.Service; s != nil {
		t.Service = &ServiceRef{Namespace: s.Namespace, Name: s.Name, Port: ptr.Deref(s.Port, 443)}
		t.original, _ = json.Marshal(s) // a ServiceReference always marshals
	}
	for i := range a.Status.Conditions {
		if a.Status.Conditions[i].Type == apiregistrationv1.Available {
			t.Available = &a.Status.Conditions[i]
		}
	}
	t.Record, t.RecordErr = readRecordSet(a).get(a.Name)
	return t
}

// WebhookTargets are the targets of a webhook configuration, one per webhook.
func WebhookTargets(obj client.Object) []Target {
	kind := kindOf(obj)
	records := readRecordSet(obj)
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
			t.original, _ = json.Marshal(s) // a ServiceReference always marshals
		}
		t.Record, t.RecordErr = records.get(w.name)
		targets = append(targets, t)
	}
	return targets
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
