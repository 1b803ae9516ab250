package diagnose

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/bridge"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// checkTargets checks every APIService that references a Service and every webhook.
func checkTargets(s *State) []Result {
	views, errs := Classify(s)
	var out []Result
	for _, e := range errs {
		check := CheckAPIService
		if e.Kind != guestnetv1.APIServiceTarget {
			check = webhookCheck(e.Kind)
		}
		out = append(out, Result{Check: check, Object: e.Name, Verdict: Fail, Detail: e.Err.Error(),
			Fix: "remove the annotation " + guestnetv1.BridgeOriginalAnnotation + " (it is not guestnet's record) to let guestnet bridge the object again", Runbook: rbOrphaned})
	}
	for i := range views {
		if views[i].Observed.IsWebhook() {
			out = append(out, checkWebhook(s, &views[i]))
		} else {
			out = append(out, checkAPIService(s, &views[i]))
		}
	}
	return out
}

// reachVerdict is what a probe or the bridge's status says about a target that goes
// through a bridge: known is false when nothing probed it yet.
type reachVerdict struct {
	known, ok bool
	message   string
	runbook   string
}

// bridgedReach reads the reachability of a target that goes through its bridge: this run's
// probe (--probe) with the bridge's own message for it, else the bridge's last probe from
// its status.
func bridgedReach(s *State, v *TargetView) reachVerdict {
	if p, ok := s.Probes[v.Observed.Key()]; ok && v.Plan.ViaBridge() {
		tp := v.Plan
		tp.SetProbe(p.Result, v.Bridge, p.Addr)
		return reachVerdict{known: true, ok: p.Result.OK(), message: tp.Message + " (probed by diagnose)", runbook: reasonRunbook(tp.Reason)}
	}
	if v.Status == nil || v.Status.Reachable == nil {
		return reachVerdict{}
	}
	rv := reachVerdict{known: true, ok: *v.Status.Reachable, message: v.Status.Message}
	if !rv.ok {
		rv.runbook = reasonRunbook(conditionReason(v.Bridge.Status.Conditions, guestnetv1.TargetsReachableCondition))
	}
	return rv
}

func reasonRunbook(reason string) string {
	switch reason {
	case guestnetv1.TLSNameMismatchReason, guestnetv1.TLSUnverifiedReason:
		return rbTLS
	}
	return rbWebhookFailed
}

// checkAPIService: the APIService is Available; when it is not, why and what to do.
func checkAPIService(s *State, v *TargetView) Result {
	t := v.Observed
	r := Result{Check: CheckAPIService, Object: t.Name}
	path := "its Service " + t.Service.String()
	if v.ViaBridge() {
		path = fmt.Sprintf("GuestWebhookBridge %s (guest Service %s, host Service %s)", v.Bridge.Name, v.Plan.Service, hostServiceOf(v))
	}
	orphan := t.Record != nil && v.Bridge == nil
	switch {
	case t.Available == nil:
		r.Verdict, r.Detail = Warn, "the aggregator has not reported Available yet (it checks within seconds of a change)"
		r.Fix, r.Runbook = "run diagnose again in a few seconds", rbAPIServiceAvailable
		return r
	case t.Available.Status == apiregistrationv1.ConditionTrue:
		r.Verdict, r.Detail = OK, "Available=True through "+path
		if t.InsecureSkipTLSVerify {
			r.Detail += " (certificate not verified: insecureSkipTLSVerify)"
		}
		if orphan {
			r.Verdict, r.Runbook = Warn, rbOrphaned
			r.Detail += fmt.Sprintf("; rewritten by GuestWebhookBridge %s, which is not a bridge of this Cluster any more", t.Record.Bridge)
			r.Fix = orphanFix(t.Record.Bridge)
		}
		return r
	}
	r.Verdict, r.Runbook = Fail, rbAPIServiceAvailable
	r.Detail = availability(t.Available) + "; `kubectl top` and every client of this API fail"
	switch {
	case orphan:
		r.Detail += fmt.Sprintf("; rewritten by GuestWebhookBridge %s, which is not a bridge of this Cluster any more", t.Record.Bridge)
		r.Fix, r.Runbook = orphanFix(t.Record.Bridge), rbOrphaned
	case v.ViaBridge():
		r.Detail += "; bridged through " + path
		if rv := bridgedReach(s, v); rv.known && !rv.ok {
			r.Fix = fmt.Sprintf("GuestWebhookBridge %s cannot call it: %s", v.Bridge.Name, rv.message)
		} else {
			r.Fix = fmt.Sprintf("the bridge answers from the host network: check that the guest apiserver resolves %s.%s.svc with the host's DNS, and the bridge's TargetsReachable condition",
				hostServiceOf(v), s.Namespace)
		}
	case v.Bridge != nil:
		r.Fix = fmt.Sprintf("GuestWebhookBridge %s selects it but has not bridged it: %s", v.Bridge.Name, pendingMessage(v))
	default:
		r.Fix = fmt.Sprintf("bridge it: add %s to spec.apiServices.names of a GuestWebhookBridge of Cluster %s", t.Name, s.ClusterName)
		if v.Plan.Reason != "" {
			r.Fix += "; the bridge would report " + v.Plan.Reason + ": " + v.Plan.Message
		}
	}
	return r
}

// hostServiceOf names the host Service a bridged target goes through.
func hostServiceOf(v *TargetView) string {
	switch {
	case v.Plan.Backend != nil:
		return v.Plan.Backend.HostService
	case v.Status != nil && v.Status.HostService != "":
		return v.Status.HostService
	}
	return "(unknown)"
}

// leftAlone reports whether a bridge leaves the target alone because the guest apiserver
// reaches it by itself (mode Auto): "bridged" without going through the bridge.
func leftAlone(tp *bridge.TargetPlan) bool { return tp.Bridged && !tp.ViaBridge() }

// pendingMessage says why a bridge that selects a target has not bridged it.
func pendingMessage(v *TargetView) string {
	switch {
	case v.Plan.Reason != "":
		return v.Plan.Reason + ": " + v.Plan.Message
	case leftAlone(&v.Plan):
		return v.Plan.Message + "; it is bridged at the bridge's next reconcile"
	}
	return "it is about to (a change is bridged within seconds); if it stays, " + fixManager
}

func orphanFix(bridgeID string) string {
	return fmt.Sprintf("GuestWebhookBridge %s was removed without restoring the original: create it again with the same namespace, name and selection and delete it once it lists the target, "+
		"or put the original service reference back by hand and remove the annotation %s", bridgeID, guestnetv1.BridgeOriginalAnnotation)
}

// checkWebhook: the guest apiserver can call the webhook: a service reference only through
// konnectivity, a bridged url through the bridge (reachable, with a certificate for the name
// it dials), someone else's url directly. Weakened failurePolicy/timeoutSeconds are warned
// about.
func checkWebhook(s *State, v *TargetView) Result {
	t := v.Observed
	r := Result{Check: webhookCheck(t.Kind), Object: t.Name + "/" + t.Webhook}
	failed := fmt.Sprintf("requests it intercepts fail with `failed calling webhook %q`", t.Webhook)
	switch {
	case t.Service != nil && t.Record != nil && v.Bridge != nil && v.RecordedBy() == ownership.BridgeID(v.Bridge):
		r.Verdict, r.Runbook = Fail, rbHelmRevert
		r.Detail = fmt.Sprintf("references Service %s again, though GuestWebhookBridge %s bridged it (a Helm upgrade or GitOps sync put the chart's service back): %s",
			t.Service, v.Bridge.Name, failed)
		r.Fix = "guestnet repairs a revert within seconds; if it stays, " + fixManager
	case t.Service != nil && leftAlone(&v.Plan):
		r.Verdict, r.Detail = OK, fmt.Sprintf("references Service %s; %s", t.Service, v.Plan.Message)
	case t.Service != nil:
		r.Verdict, r.Runbook = Fail, rbWebhookFailed
		r.Detail = fmt.Sprintf("references Service %s: the guest apiserver dials its ClusterIP, which it cannot reach from the host network: %s", t.Service, failed)
		switch {
		case v.Bridge != nil:
			r.Fix = fmt.Sprintf("GuestWebhookBridge %s selects it but has not bridged it: %s", v.Bridge.Name, pendingMessage(v))
		case t.Record != nil:
			r.Fix, r.Runbook = orphanFix(t.Record.Bridge), rbOrphaned
		default:
			r.Fix = fmt.Sprintf("bridge it: add %s to spec.%s.names of a GuestWebhookBridge of Cluster %s", t.Name, selectorField(t.Kind), s.ClusterName)
			if v.Plan.TLSServerName != "" {
				r.Fix += fmt.Sprintf("; its serving certificate must then carry %s", v.Plan.TLSServerName)
			}
			if v.Plan.Reason != "" {
				r.Fix += "; the bridge would report " + v.Plan.Reason + ": " + v.Plan.Message
			}
		}
	case v.ViaBridge():
		base := fmt.Sprintf("bridged by GuestWebhookBridge %s (url %s)", v.Bridge.Name, t.URL)
		switch rv := bridgedReach(s, v); {
		case !rv.known:
			r.Verdict, r.Detail = Warn, base+"; not probed yet"
			r.Fix, r.Runbook = fixUnprobed, rbWebhookFailed
		case rv.ok:
			r.Verdict, r.Detail = OK, base+"; "+rv.message
		default:
			r.Verdict, r.Detail, r.Runbook = Fail, base+"; "+rv.message, rv.runbook
			r.Fix = "act on the bridge's message above"
		}
	case t.Record != nil && v.Bridge == nil && bridge.IsRewritten(t):
		r = checkURL(s, v, r)
		r.Detail = fmt.Sprintf("rewritten by GuestWebhookBridge %s, which is not a bridge of this Cluster any more; %s", t.Record.Bridge, r.Detail)
		if r.Verdict == OK {
			r.Verdict = Warn
		}
		r.Fix, r.Runbook = orphanFix(t.Record.Bridge), rbOrphaned
	case t.URL != "":
		r = checkURL(s, v, r)
	default:
		r.Verdict, r.Detail = Warn, "has neither clientConfig.service nor clientConfig.url"
		r.Fix, r.Runbook = "fix the webhook configuration", rbWebhookFailed
	}
	if len(v.Plan.Warnings) > 0 {
		warning := strings.Join(v.Plan.Warnings, "; ")
		if r.Verdict == OK {
			r.Verdict, r.Fix, r.Runbook = Warn, warning, rbWeakened
		} else {
			r.Detail += "; also: " + warning
		}
	}
	return r
}

// checkURL checks a webhook whose url the guest apiserver dials directly: a probe when
// diagnose ran one, the endpoints of a host Service the url names, the field report's
// one-worker-IP workaround.
func checkURL(s *State, v *TargetView, r Result) Result {
	t := v.Observed
	_, _, hostSvc, err := urlAddress(t.URL, s.Namespace, s.Services)
	if err != nil {
		r.Verdict, r.Detail = Fail, fmt.Sprintf("url %q does not parse: %v", t.URL, err)
		r.Fix, r.Runbook = "fix the url", rbWebhookFailed
		return r
	}
	if p, ok := s.Probes[t.Key()]; ok {
		if p.Result.OK() {
			r.Verdict, r.Detail = OK, fmt.Sprintf("url %s answers at %s with a certificate valid for %s (probed by diagnose)", t.URL, p.Addr, p.ServerName)
			return r
		}
		r.Verdict, r.Runbook = Fail, rbWebhookFailed
		r.Detail = fmt.Sprintf("url %s: %s", t.URL, probeProblem(p))
		if p.Result.Answered {
			r.Runbook = rbTLS
			r.Fix = fmt.Sprintf("serve a certificate that carries %s and verifies against the webhook's caBundle", p.ServerName)
		} else {
			r.Fix = "make the url reach the webhook from the guest apiserver's network, or bridge the webhook instead (a GuestWebhookBridge)"
		}
		if isIPHost(t.URL) {
			r.Fix = ipURLFix(s, t)
		}
		return r
	}
	switch {
	case isIPHost(t.URL):
		r.Verdict, r.Runbook = Warn, rbWebhookFailed
		r.Detail = fmt.Sprintf("url %s names an IP (the field report's workaround): it breaks when that worker goes, and the certificate must carry that IP", t.URL)
		r.Fix = ipURLFix(s, t)
	case hostSvc != nil:
		ready, total := ingress.CountEndpoints(slicesOf(s, hostSvc.Name))
		if ready == 0 {
			r.Verdict, r.Runbook = Fail, rbWebhookFailed
			r.Detail = fmt.Sprintf("url %s names host Service %s, which has no ready endpoint (%d endpoints): %s", t.URL, hostSvc.Name, total,
				fmt.Sprintf("requests it intercepts fail with `failed calling webhook %q`", t.Webhook))
			r.Fix = "see the service check of " + hostSvc.Name
			return r
		}
		r.Verdict, r.Detail = OK, fmt.Sprintf("url %s names host Service %s (%d of %d endpoints ready); TLS not checked without --probe", t.URL, hostSvc.Name, ready, total)
	default:
		r.Verdict, r.Detail = OK, fmt.Sprintf("url %s: dialed directly by the guest apiserver; not checked without --probe", t.URL)
	}
	return r
}

func ipURLFix(s *State, t bridge.Target) string {
	return fmt.Sprintf("bridge it instead: put the chart's service reference back (service and url are exclusive: set url to null in the same write) and add %s to spec.%s.names of a GuestWebhookBridge of Cluster %s",
		t.Name, selectorField(t.Kind), s.ClusterName)
}

// probeProblem says what a failed probe found, in the words of the bridge's messages.
func probeProblem(p ProbeOutcome) string {
	res := p.Result
	switch {
	case !res.Answered:
		return fmt.Sprintf("no TLS answer at %s: %s", p.Addr, res.Detail)
	case res.NameMissing:
		names := append(append([]string{}, res.DNSNames...), res.IPs...)
		return fmt.Sprintf("its certificate carries [%s] but not %s, the name the guest apiserver verifies", strings.Join(names, " "), p.ServerName)
	default:
		return "answers, but " + res.Detail
	}
}

// checkKonnectivity: which case the cluster is in (docs/runbook.md, "Konnectivity: working or
// broken"): konnectivity agents that carry the guest apiserver's calls to guest Services (its
// egress reaches the webhooks' Services), agents that do not, or none.
func checkKonnectivity(s *State) Result {
	r := Result{Check: CheckKonnectivity}
	agents := s.Guest.Agents
	reach := bridge.GuestReachesServices(agents, s.Guest.Observed.APIServices, s.Guest.Egress)
	switch {
	case reach.Reaches:
		r.Verdict, r.Detail = OK, reach.Evidence+" (GuestWebhookBridges in mode Auto leave service references alone)"
	case len(agents) == 0:
		r.Verdict, r.Detail = OK, reach.Evidence+"; every webhook and APIService that references a Service needs a GuestWebhookBridge (see their checks)"
	default:
		r.Verdict, r.Detail, r.Runbook = Warn, fmt.Sprintf("%d konnectivity agent pods: %s", len(agents), reach.Evidence), rbKonnectivity
		r.Fix = "check the agents (kubectl --context guest -n kube-system get pods -l k8s-app=konnectivity-agent; their logs) and the control plane's konnectivity-server; " +
			"until they carry traffic, service references need a GuestWebhookBridge"
	}
	return r
}

func conditionReason(conds []metav1.Condition, t string) string {
	if c := meta.FindStatusCondition(conds, t); c != nil {
		return c.Reason
	}
	return ""
}
