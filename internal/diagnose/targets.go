package diagnose

import (
	"cmp"
	"net"
	"net/url"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// TargetView is one way the guest apiserver calls out (an APIService, or one webhook of a
// configuration), with what guestnet makes of it.
type TargetView struct {
	// Observed is the target as the guest holds it now.
	Observed bridge.Target
	// Plan is the decision of the bridge that selects it (bridge.MakePlan, as the controller
	// makes it), or, when no bridge of the cluster selects it, of a bridge that would select
	// it in mode Auto: whether the guest apiserver reaches it without one, the name its
	// certificate would have to carry, the warnings.
	Plan bridge.TargetPlan
	// Bridge is the cluster's GuestWebhookBridge that selects the target; nil when none does.
	Bridge *guestnetv1.GuestWebhookBridge
	// Status is Bridge's status entry for the target, if it has one.
	Status *guestnetv1.TargetStatus
}

// RecordedBy is the bridge ("<namespace>/<name>") whose record the target carries, "" when none.
func (v *TargetView) RecordedBy() string {
	if v.Observed.Record == nil {
		return ""
	}
	return v.Observed.Record.Bridge
}

// ViaBridge reports whether the target holds what its bridge wrote: its calls go through
// the bridge's host Service.
func (v *TargetView) ViaBridge() bool {
	return v.Bridge != nil && bridge.IsRewritten(v.Observed) && v.RecordedBy() == ownership.BridgeID(v.Bridge)
}

// noBridge names the bridge that plans the targets no bridge of the cluster selects. It is
// not a valid object name, so no real bridge can have it.
const noBridge = "<none>"

// recordErr is the first record error of a webhook configuration's targets.
func recordErr(ts []bridge.Target) error {
	for _, t := range ts {
		if t.RecordErr != nil {
			return t.RecordErr
		}
	}
	return nil
}

// ObjectError is a guest object whose targets cannot be read (an annotation that is not
// guestnet's record): reported as such, left out of the classification.
type ObjectError struct {
	Kind guestnetv1.TargetKind
	Name string
	Err  error
}

// Classify lists every APIService that references a Service (or carries guestnet's record)
// and every webhook of the guest, with the decision of the bridge that selects it. It uses
// the bridge package's own selection and plan, so that diagnose says what the controller
// does.
func Classify(s *State) ([]TargetView, []ObjectError) {
	g := s.Guest
	var views []TargetView
	var errs []ObjectError
	obs := bridge.Observed{}
	for i := range g.Observed.APIServices {
		a := &g.Observed.APIServices[i]
		t := bridge.APIServiceTarget(a)
		if err := t.RecordErr; err != nil {
			errs = append(errs, ObjectError{Kind: guestnetv1.APIServiceTarget, Name: a.Name, Err: err})
			continue
		}
		obs.APIServices = append(obs.APIServices, *a)
		if t.Service != nil || t.Record != nil {
			views = append(views, TargetView{Observed: t})
		}
	}
	for i := range g.Observed.ValidatingWebhooks {
		c := &g.Observed.ValidatingWebhooks[i]
		ts := bridge.WebhookTargets(c)
		if err := recordErr(ts); err != nil {
			errs = append(errs, ObjectError{Kind: guestnetv1.ValidatingWebhookTarget, Name: c.Name, Err: err})
			continue
		}
		obs.ValidatingWebhooks = append(obs.ValidatingWebhooks, *c)
		for _, t := range ts {
			views = append(views, TargetView{Observed: t})
		}
	}
	for i := range g.Observed.MutatingWebhooks {
		c := &g.Observed.MutatingWebhooks[i]
		ts := bridge.WebhookTargets(c)
		if err := recordErr(ts); err != nil {
			errs = append(errs, ObjectError{Kind: guestnetv1.MutatingWebhookTarget, Name: c.Name, Err: err})
			continue
		}
		obs.MutatingWebhooks = append(obs.MutatingWebhooks, *c)
		for _, t := range ts {
			views = append(views, TargetView{Observed: t})
		}
	}
	slices.SortFunc(views, func(a, b TargetView) int { return strings.Compare(a.Observed.Key(), b.Observed.Key()) })
	byKey := map[string]*TargetView{}
	for i := range views {
		byKey[views[i].Observed.Key()] = &views[i]
	}

	reach := bridge.GuestReachesServices(g.Agents, g.Observed.APIServices, g.Egress)
	for i := range s.Bridges {
		b := &s.Bridges[i]
		host := bridge.ReadHostRecords(ownership.BridgeID(b), b.Status.Records)
		targets, err := bridge.Select(&b.Spec, obs, host)
		if err != nil {
			continue // an invalid selector: the bridge's own conditions say so
		}
		// Every bridge a record names counts as existing: diagnose reports the record's
		// bridge, the controller decides on take-overs.
		claimants := map[string]bool{}
		for _, v := range views {
			claimants[v.RecordedBy()] = true
		}
		in := bridge.Input{Bridge: b, Targets: targets, Host: host, Claimants: claimants, GuestServices: g.Services}
		if b.Spec.Mode != guestnetv1.BridgeModeAlways {
			in.Reach = reach
		}
		for _, tp := range bridge.MakePlan(in).Targets {
			v := byKey[tp.Key()]
			if v == nil {
				continue // not in the guest (the bridge reports TargetNotFound), or served by the guest apiserver itself
			}
			// Two bridges selecting one target: the one whose record it carries has it.
			if v.Bridge != nil && v.RecordedBy() != ownership.BridgeID(b) {
				continue
			}
			v.Plan, v.Bridge, v.Status = tp, b, targetStatus(b, tp.Target)
		}
	}

	var rest []bridge.Target
	for _, v := range views {
		if v.Bridge == nil {
			rest = append(rest, v.Observed)
		}
	}
	if len(rest) > 0 {
		none := &guestnetv1.GuestWebhookBridge{
			ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: noBridge},
			Spec: guestnetv1.GuestWebhookBridgeSpec{
				ClusterName:   s.ClusterName,
				NodePortRange: guestnetv1.NodePortRange{Start: 30064, Size: 16},
				Mode:          guestnetv1.BridgeModeAuto,
			},
		}
		for _, tp := range bridge.MakePlan(bridge.Input{Bridge: none, Targets: rest, GuestServices: g.Services, Reach: reach}).Targets {
			byKey[tp.Key()].Plan = tp
		}
	}
	return views, errs
}

// targetStatus finds the status entry of b for target t.
func targetStatus(b *guestnetv1.GuestWebhookBridge, t bridge.Target) *guestnetv1.TargetStatus {
	for i := range b.Status.Targets {
		st := &b.Status.Targets[i]
		if st.Kind == t.Kind && st.Name == t.Name && st.Webhook == t.Webhook {
			return st
		}
	}
	return nil
}

// selectorField is the GuestWebhookBridge spec field that selects targets of kind.
func selectorField(kind guestnetv1.TargetKind) string {
	switch kind {
	case guestnetv1.ValidatingWebhookTarget:
		return "validatingWebhooks"
	case guestnetv1.MutatingWebhookTarget:
		return "mutatingWebhooks"
	}
	return "apiServices"
}

// urlAddress is where a webhook url is dialed from diagnose: a host Service of the
// Cluster's namespace named "<svc>.<namespace>.svc" at its ClusterIP (as the guest
// apiserver reaches it after resolving the name with the host's DNS), else the url's host.
// serverName is the url's host, which the guest apiserver verifies.
func urlAddress(rawURL, namespace string, services []corev1.Service) (addr, serverName string, hostSvc *corev1.Service, err error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", "", nil, err
	}
	host, port := u.Hostname(), cmp.Or(u.Port(), "443")
	hostSvc = hostServiceNamed(host, namespace, services)
	if hostSvc != nil && hostSvc.Spec.ClusterIP != "" && hostSvc.Spec.ClusterIP != corev1.ClusterIPNone {
		return net.JoinHostPort(hostSvc.Spec.ClusterIP, port), host, hostSvc, nil
	}
	return net.JoinHostPort(host, port), host, hostSvc, nil
}

// hostServiceNamed returns the Service of namespace that host names ("<svc>.<namespace>.svc",
// with or without ".cluster.local"), nil when host names none.
func hostServiceNamed(host, namespace string, services []corev1.Service) *corev1.Service {
	name, ok := strings.CutSuffix(strings.TrimSuffix(host, ".cluster.local"), "."+namespace+".svc")
	if !ok {
		return nil
	}
	for i := range services {
		if services[i].Name == name {
			return &services[i]
		}
	}
	return nil
}

// isIPHost reports whether a url's host is an IP address (the field report's workaround:
// one worker's IP and a NodePort).
func isIPHost(rawURL string) bool {
	u, err := url.Parse(rawURL)
	return err == nil && net.ParseIP(u.Hostname()) != nil
}

// webhookCheck is the check name of a webhook of a configuration of kind.
func webhookCheck(kind guestnetv1.TargetKind) string {
	if kind == guestnetv1.MutatingWebhookTarget {
		return CheckMutatingWebhook
	}
	return CheckValidatingWebhook
}

func availability(c *apiregistrationv1.APIServiceCondition) string {
	s := "Available=" + string(c.Status)
	if c.Reason != "" {
		s += " (" + c.Reason + ")"
	}
	if c.Message != "" {
		s += ": " + c.Message
	}
	return s
}
