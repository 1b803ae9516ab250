package bridge

import (
	"testing"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
)

// guestSim is a guest in memory, reconciled the way the controller does it with this
// package's functions: plan, apply the bridge's guest Services of the backends in use (and
// delete its others), rewrite or forget targets, restore the ones no longer selected.
type guestSim struct {
	t        *testing.T
	gwb      *guestnetv1.GuestWebhookBridge
	obs      Observed
	services []corev1.Service
	reach    Reachability
	// writes counts the objects changed by the last reconcile.
	writes int
}

func (s *guestSim) reconcile(g Gomega) *Plan {
	targets, err := Select(&s.gwb.Spec, s.obs)
	g.Expect(err).NotTo(HaveOccurred())
	p := MakePlan(Input{Bridge: s.gwb, Targets: targets, GuestServices: s.services, Reach: s.reach})
	checkPlanInvariants(g, s.gwb, p)
	s.writes = 0

	keep := map[string]bool{}
	for _, b := range p.Backends {
		if !p.Used(b) {
			continue
		}
		s.apply(GuestNodePortService(s.gwb, b), keep)
		if b.APIService {
			s.apply(GuestExternalNameService(s.gwb, b), keep)
		}
	}
	var services []corev1.Service
	for _, svc := range s.services {
		if hostnames.IsBridgeObject(&svc, s.gwb) && !keep[svc.Namespace+"/"+svc.Name] {
			s.writes++
			continue
		}
		services = append(services, svc)
	}
	s.services = services

	selected := map[string]bool{}
	for _, tp := range p.Targets {
		selected[tp.Key()] = true
		if tp.Reason != "" && tp.Action == RewriteAction && !IsRewritten(tp.Target) {
			continue // as the controller does
		}
		switch tp.Action {
		case RewriteAction:
			s.edit(g, tp.Target, func(obj client.Object) (bool, error) {
				if tp.IsWebhook() {
					return RewriteWebhook(obj, tp.Webhook, tp.URL, me)
				}
				return RewriteAPIService(obj.(*apiregistrationv1.APIService), *tp.APIServiceRef, me)
			})
		case ForgetAction:
			s.edit(g, tp.Target, func(obj client.Object) (bool, error) { return ForgetWebhook(obj, tp.Webhook, me) })
		}
	}
	s.restore(g, func(t Target) bool { return !selected[t.Key()] })
	return p
}

// restore puts back the targets of this bridge that accept says to.
func (s *guestSim) restore(g Gomega, accept func(Target) bool) {
	var recorded []Target
	for i := range s.obs.APIServices {
		t, err := APIServiceTarget(&s.obs.APIServices[i])
		g.Expect(err).NotTo(HaveOccurred())
		recorded = append(recorded, t)
	}
	for _, obj := range s.configs() {
		ts, err := WebhookTargets(obj)
		g.Expect(err).NotTo(HaveOccurred())
		recorded = append(recorded, ts...)
	}
	for _, t := range recorded {
		if t.Record == nil || t.Record.Bridge != me || !accept(t) {
			continue
		}
		s.edit(g, t, func(obj client.Object) (bool, error) {
			if t.IsWebhook() {
				return RestoreWebhook(obj, t.Webhook, me)
			}
			return RestoreAPIService(obj.(*apiregistrationv1.APIService), me)
		})
	}
}

// deleteBridge is the controller's deletion: restore everything, delete the Services.
func (s *guestSim) deleteBridge(g Gomega) {
	s.restore(g, func(Target) bool { return true })
	var services []corev1.Service
	for _, svc := range s.services {
		if !hostnames.IsBridgeObject(&svc, s.gwb) {
			services = append(services, svc)
		}
	}
	s.services = services
}

func (s *guestSim) apply(ac *corev1ac.ServiceApplyConfiguration, keep map[string]bool) {
	svc := toService(s.t, ac)
	keep[svc.Namespace+"/"+svc.Name] = true
	for i := range s.services {
		if s.services[i].Namespace == svc.Namespace && s.services[i].Name == svc.Name {
			if !equality.Semantic.DeepEqual(s.services[i], svc) {
				s.writes++
			}
			s.services[i] = svc
			return
		}
	}
	s.writes++
	s.services = append(s.services, svc)
}

func (s *guestSim) edit(g Gomega, t Target, apply func(client.Object) (bool, error)) {
	obj := s.object(t)
	g.Expect(obj).NotTo(BeNil(), "%s", t)
	changed, err := apply(obj)
	g.Expect(err).NotTo(HaveOccurred())
	if changed {
		s.writes++
	}
}

func (s *guestSim) object(t Target) client.Object {
	switch t.Kind {
	case guestnetv1.APIServiceTarget:
		for i := range s.obs.APIServices {
			if s.obs.APIServices[i].Name == t.Name {
				return &s.obs.APIServices[i]
			}
		}
	default:
		for _, obj := range s.configs() {
			if kindOf(obj) == t.Kind && obj.GetName() == t.Name {
				return obj
			}
		}
	}
	return nil
}

func (s *guestSim) configs() []client.Object {
	var out []client.Object
	for i := range s.obs.ValidatingWebhooks {
		out = append(out, &s.obs.ValidatingWebhooks[i])
	}
	for i := range s.obs.MutatingWebhooks {
		out = append(out, &s.obs.MutatingWebhooks[i])
	}
	return out
}

func (s *guestSim) service(ns, name string) *corev1.Service {
	return findService(s.services, ns, name)
}

// fieldReportGuest is the guest of the field report: cert-manager's two webhooks and
// metrics-server's APIService, none reachable, plus an ingress NodePort in the bridge's range.
func fieldReportGuest(t *testing.T) *guestSim {
	all := &guestnetv1.TargetSelector{All: true}
	gwb := newBridge(func(b *guestnetv1.GuestWebhookBridge) {
		b.Spec.APIServices = &guestnetv1.TargetSelector{Names: []string{metricsAPI}}
		b.Spec.ValidatingWebhooks, b.Spec.MutatingWebhooks = all, all
	})
	return &guestSim{
		t:   t,
		gwb: gwb,
		obs: Observed{
			APIServices:        []apiregistrationv1.APIService{*metricsAPIService(), *apiService("v1.apps", nil, apiregistrationv1.ConditionTrue)},
			ValidatingWebhooks: []admissionregistrationv1.ValidatingWebhookConfiguration{*certManagerVWC()},
			MutatingWebhooks:   []admissionregistrationv1.MutatingWebhookConfiguration{*certManagerMWC()},
		},
		services: append(defaultGuestServices(), nodePortService("projectcontour", "envoy", 30080, 32700)),
		reach:    Reachability{Evidence: "no ready konnectivity agent"},
	}
}

func TestConvergeAndRestore(t *testing.T) {
	g := NewWithT(t)
	s := fieldReportGuest(t)
	originalObs := Observed{
		APIServices:        []apiregistrationv1.APIService{*s.obs.APIServices[0].DeepCopy(), *s.obs.APIServices[1].DeepCopy()},
		ValidatingWebhooks: []admissionregistrationv1.ValidatingWebhookConfiguration{*s.obs.ValidatingWebhooks[0].DeepCopy()},
		MutatingWebhooks:   []admissionregistrationv1.MutatingWebhookConfiguration{*s.obs.MutatingWebhooks[0].DeepCopy()},
	}

	// First reconcile: everything is bridged at once.
	p := s.reconcile(g)
	g.Expect(s.writes).To(Equal(6), "2 NodePort Services, 1 ExternalName Service, 3 objects")
	bridged, total := Counts(p)
	g.Expect(bridged).To(Equal(int32(3)))
	g.Expect(total).To(Equal(int32(3)))
	g.Expect(s.obs.ValidatingWebhooks[0].Webhooks[0].ClientConfig.URL).To(Equal(ptr.To(cmValidateURL)))
	g.Expect(s.obs.ValidatingWebhooks[0].Webhooks[0].ClientConfig.Service).To(BeNil())
	g.Expect(s.obs.MutatingWebhooks[0].Webhooks[0].ClientConfig.URL).To(Equal(ptr.To("https://" + cmHostService + ".k0smotron.svc/mutate")))
	g.Expect(s.obs.APIServices[0].Spec.Service).To(Equal(apiRef(msNS, "metrics-server-guestnet", 443)))
	g.Expect(s.obs.APIServices[0].Spec.InsecureSkipTLSVerify).To(BeTrue())
	g.Expect(s.obs.APIServices[1].Annotations).To(BeEmpty(), "not selected, not touched")
	// 32700 is envoy's.
	g.Expect(s.service(cmNS, "cert-manager-webhook-guestnet-nodeport").Spec.Ports[0].NodePort).To(Equal(int32(32701)))
	g.Expect(s.service(msNS, "metrics-server-guestnet-nodeport").Spec.Ports[0].NodePort).To(Equal(int32(32702)))
	g.Expect(s.service(msNS, "metrics-server-guestnet").Spec.ExternalName).To(Equal(msHostService + ".k0smotron.svc"))

	// Steady state: nothing to write, nothing moves, the targets read as rewritten.
	for range 2 {
		p = s.reconcile(g)
		g.Expect(s.writes).To(BeZero())
		for _, tp := range p.Targets {
			g.Expect(tp.Action).To(Equal(NoAction), tp.Key())
			g.Expect(tp.Bridged).To(BeTrue(), tp.Key())
			g.Expect(tp.ViaBridge()).To(BeTrue(), tp.Key())
			g.Expect(tp.Reason).To(BeEmpty(), tp.Key())
		}
	}

	// envoy gives 32700 back: the bridge's nodePorts stay where they are.
	s.services[2].Spec.Ports = s.services[2].Spec.Ports[:1]
	s.reconcile(g)
	g.Expect(s.writes).To(BeZero())
	g.Expect(s.service(cmNS, "cert-manager-webhook-guestnet-nodeport").Spec.Ports[0].NodePort).To(Equal(int32(32701)))

	// cainjector rotates the CA; Helm upgrades cert-manager and puts the service back.
	s.obs.ValidatingWebhooks[0].Webhooks[0].ClientConfig.CABundle = []byte("ca-2")
	s.obs.ValidatingWebhooks[0].Webhooks[0].ClientConfig.URL = nil
	s.obs.ValidatingWebhooks[0].Webhooks[0].ClientConfig.Service = whRef(cmNS, cmSvc, 443, "/validate")
	p = s.reconcile(g)
	g.Expect(s.writes).To(Equal(1), "the repair")
	g.Expect(s.obs.ValidatingWebhooks[0].Webhooks[0].ClientConfig.URL).To(Equal(ptr.To(cmValidateURL)))
	g.Expect(s.obs.ValidatingWebhooks[0].Webhooks[0].ClientConfig.CABundle).To(Equal([]byte("ca-2")))
	s.reconcile(g)
	g.Expect(s.writes).To(BeZero())

	// The mutating webhook is dropped from the bridge: restored, the others stay.
	s.gwb.Spec.MutatingWebhooks = nil
	s.reconcile(g)
	g.Expect(s.writes).To(Equal(1))
	expectSameObject(g, &s.obs.MutatingWebhooks[0], &originalObs.MutatingWebhooks[0])
	g.Expect(s.service(cmNS, "cert-manager-webhook-guestnet-nodeport")).NotTo(BeNil(), "the validating webhook still uses it")

	// The bridge goes: every original is back, byte for byte but for cainjector's caBundle.
	s.deleteBridge(g)
	want := originalObs.ValidatingWebhooks[0].DeepCopy()
	want.Webhooks[0].ClientConfig.CABundle = []byte("ca-2")
	expectSameObject(g, &s.obs.ValidatingWebhooks[0], want)
	expectSameObject(g, &s.obs.APIServices[0], &originalObs.APIServices[0])
	expectSameObject(g, &s.obs.APIServices[1], &originalObs.APIServices[1])
	g.Expect(s.services).To(HaveLen(3), "only the guest's own Services are left")
}

func TestConvergeAuto(t *testing.T) {
	g := NewWithT(t)
	s := fieldReportGuest(t)
	s.reach = Reachability{Reaches: true, Evidence: "2 konnectivity agents are ready"}
	// The aggregator has not checked metrics-server yet.
	s.obs.APIServices[0].Status.Conditions = nil

	p := s.reconcile(g)
	g.Expect(s.writes).To(BeZero(), "never rewrite what already works")
	g.Expect(s.services).To(HaveLen(3))
	reasons := map[string]string{}
	for _, tp := range p.Targets {
		reasons[tp.Key()] = tp.Reason
	}
	g.Expect(reasons).To(Equal(map[string]string{
		"APIService/v1beta1.metrics.k8s.io":                                           guestnetv1.WaitingForAvailabilityReason,
		"MutatingWebhookConfiguration/cert-manager-webhook/webhook.cert-manager.io":   "",
		"ValidatingWebhookConfiguration/cert-manager-webhook/webhook.cert-manager.io": "",
	}))

	// The aggregator fails to reach it: bridged.
	s.obs.APIServices[0].Status.Conditions = metricsAPIService().Status.Conditions
	s.reconcile(g)
	g.Expect(s.writes).To(Equal(3), "NodePort and ExternalName Services, the APIService")
	g.Expect(s.obs.APIServices[0].Spec.Service.Name).To(Equal("metrics-server-guestnet"))

	// Through the bridge it becomes available: it stays bridged.
	s.obs.APIServices[0].Status.Conditions = apiService(metricsAPI, nil, apiregistrationv1.ConditionTrue).Status.Conditions
	p = s.reconcile(g)
	g.Expect(s.writes).To(BeZero())
	g.Expect(p.Targets[0].Key()).To(Equal("APIService/v1beta1.metrics.k8s.io"))
	g.Expect(p.Targets[0].ViaBridge()).To(BeTrue())

	// Someone points a webhook at a url of theirs: guestnet leaves it, and forgets nothing
	// it did not do.
	s.obs.ValidatingWebhooks[0].Webhooks[0].ClientConfig.Service = nil
	s.obs.ValidatingWebhooks[0].Webhooks[0].ClientConfig.URL = ptr.To("https://cm.example.com/validate")
	s.reconcile(g)
	g.Expect(s.writes).To(BeZero())
	g.Expect(s.obs.ValidatingWebhooks[0].Annotations).NotTo(HaveKey(guestnetv1.BridgeOriginalAnnotation))
}

func TestConvergeForget(t *testing.T) {
	g := NewWithT(t)
	s := fieldReportGuest(t)
	s.reconcile(g)
	// The user switches cert-manager to its own url (webhook.url.host).
	s.obs.ValidatingWebhooks[0].Webhooks[0].ClientConfig.URL = ptr.To("https://cert-manager.example.com/validate")
	p := s.reconcile(g)
	g.Expect(s.writes).To(Equal(1), "the record is dropped")
	g.Expect(p.Targets[2].Key()).To(Equal("ValidatingWebhookConfiguration/cert-manager-webhook/webhook.cert-manager.io"))
	g.Expect(p.Targets[2].Action).To(Equal(ForgetAction))
	g.Expect(records(g, &s.obs.ValidatingWebhooks[0])).To(BeEmpty())
	p = s.reconcile(g)
	g.Expect(s.writes).To(BeZero())
	// No service, no record: "all" no longer selects it.
	var keys []string
	for _, tp := range p.Targets {
		keys = append(keys, tp.Key())
	}
	g.Expect(keys).To(Equal([]string{"APIService/v1beta1.metrics.k8s.io", "MutatingWebhookConfiguration/cert-manager-webhook/webhook.cert-manager.io"}))

	// Named explicitly, it is reported as left alone.
	s.gwb.Spec.ValidatingWebhooks = &guestnetv1.TargetSelector{Names: []string{cmSvc}}
	p = s.reconcile(g)
	g.Expect(s.writes).To(BeZero())
	g.Expect(p.Targets[2].Action).To(Equal(NoAction))
	g.Expect(p.Targets[2].Bridged).To(BeFalse())
	g.Expect(p.Targets[2].Message).To(ContainSubstring("already"))

	// Deleting the bridge leaves their url.
	s.deleteBridge(g)
	g.Expect(s.obs.ValidatingWebhooks[0].Webhooks[0].ClientConfig.URL).To(Equal(ptr.To("https://cert-manager.example.com/validate")))
	g.Expect(s.obs.MutatingWebhooks[0].Webhooks[0].ClientConfig.Service).NotTo(BeNil())
}
