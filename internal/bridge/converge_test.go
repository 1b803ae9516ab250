package bridge

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
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
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// guestSim is a guest in memory, reconciled the way the controller does it with this
// package's functions: plan, apply the bridge's guest Services of the backends in use (and
// delete its others), store the pending host copy of the records, write each guest object
// as the JSON patch GuestPatch makes (applied with the apiserver's JSON patch library to the
// object's JSON), then store the final host copy.
type guestSim struct {
	t        *testing.T
	gwb      *guestnetv1.GuestWebhookBridge
	obs      Observed
	services []corev1.Service
	reach    Reachability
	// writes counts the objects changed by the last reconcile (the host copy of the records
	// counts as one object); total counts every write since the start.
	writes, total int
	// crashAfter, when not 0, makes the write after the crashAfter-th one "crash" the
	// controller: it panics with errCrashed (see survive).
	crashAfter int
}

type crashed struct{}

// write counts a write, or crashes instead of the (crashAfter+1)-th one.
func (s *guestSim) write() {
	if s.crashAfter != 0 && s.total == s.crashAfter {
		panic(crashed{})
	}
	s.writes++
	s.total++
}

// survive runs f and reports whether it crashed; after a crash the budget is gone (the
// restarted controller writes freely).
func (s *guestSim) survive(f func()) (didCrash bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(crashed); !ok {
				panic(r)
			}
			didCrash = true
			s.crashAfter = 0
		}
	}()
	f()
	return false
}

func (s *guestSim) input(_ Gomega) Input {
	host := ReadHostRecords(me, s.gwb.Status.Records)
	hostServices := map[string]bool{}
	for _, svc := range s.services {
		if ownership.IsBridgeObject(&svc, s.gwb) && svc.Spec.Type == corev1.ServiceTypeNodePort {
			hostServices[hostnames.BridgeHostService(s.gwb.Spec.ClusterName, svc.Namespace, strings.TrimSuffix(svc.Name, "-guestnet-nodeport"))] = true
		}
	}
	return Input{Bridge: s.gwb, All: AllTargets(s.obs), Host: host, GuestServices: s.services, Reach: s.reach,
		HostServices: hostServices, Claimants: map[string]bool{}}
}

func (s *guestSim) reconcile(g Gomega) *Plan {
	in := s.input(g)
	targets, err := Select(&s.gwb.Spec, s.obs, in.Host)
	g.Expect(err).NotTo(HaveOccurred())
	in.Targets = targets
	p := MakePlan(in)
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
	s.writeTargets(g, p)
	if !p.KeepServices {
		s.deleteServices(func(svc *corev1.Service) bool { return !keep[svc.Namespace+"/"+svc.Name] })
	}
	return p
}

// writeTargets writes the plan's changes: host copy first, guest objects, host copy again.
func (s *guestSim) writeTargets(g Gomega, p *Plan) {
	pending := p.PendingHostRecords()
	if p.HostRecordsChanged(pending) {
		s.write()
		s.gwb.Status.Records = HostRecordsStatus(pending)
	}
	objects, byObject := p.Changes()
	for _, key := range objects {
		observed := s.obs.Object(byObject[key][0].Target)
		g.Expect(observed).NotTo(BeNil(), key)
		edited := observed.DeepCopyObject().(client.Object)
		_, err := Apply(edited, byObject[key], me)
		g.Expect(err).NotTo(HaveOccurred())
		data, err := GuestPatch(observed, edited)
		g.Expect(err).NotTo(HaveOccurred())
		if data == nil {
			continue
		}
		s.write()
		patched := applyJSONPatch(g, observed, data)
		g.Expect(mustJSON(s.t, patched)).To(MatchJSON(mustJSON(s.t, edited)), "the patch writes exactly the edit")
		reflect.ValueOf(observed).Elem().Set(reflect.ValueOf(patched).Elem())
	}
	if final := p.HostRecords(); !SameHostRecords(pending, final) {
		s.write()
		s.gwb.Status.Records = HostRecordsStatus(final)
	}
}

// applyJSONPatch applies a JSON patch to obj's JSON with the apiserver's library and decodes
// the result into a new object of obj's type (as the apiserver would store it).
func applyJSONPatch(g Gomega, obj client.Object, patch []byte) client.Object {
	doc, err := json.Marshal(obj)
	g.Expect(err).NotTo(HaveOccurred())
	decoded, err := jsonpatch.DecodePatch(patch)
	g.Expect(err).NotTo(HaveOccurred())
	out, err := decoded.Apply(doc)
	g.Expect(err).NotTo(HaveOccurred(), "patch %s", patch)
	result := reflect.New(reflect.TypeOf(obj).Elem()).Interface().(client.Object)
	g.Expect(json.Unmarshal(out, result)).To(Succeed())
	if len(result.GetAnnotations()) == 0 {
		result.SetAnnotations(nil) // the apiserver stores no empty map: it reads back as none
	}
	return result
}

// deleteBridge is the controller's deletion: restore everything, delete the Services.
func (s *guestSim) deleteBridge(g Gomega) {
	in := s.input(g)
	p := PlanDeletion(in)
	for _, tp := range p.Restores {
		g.Expect(tp.Reason).To(BeEmpty(), "%s cannot be restored: %s", tp.Target, tp.Message)
	}
	s.writeTargets(g, p)
	g.Expect(s.gwb.Status.Records).To(BeEmpty())
	s.deleteServices(func(*corev1.Service) bool { return true })
}

// deleteServices deletes the bridge's Services that del accepts, one write each.
func (s *guestSim) deleteServices(del func(*corev1.Service) bool) {
	for i := 0; i < len(s.services); {
		if svc := &s.services[i]; ownership.IsBridgeObject(svc, s.gwb) && del(svc) {
			s.write()
			s.services = slices.Delete(s.services, i, i+1)
			continue
		}
		i++
	}
}

func (s *guestSim) apply(ac *corev1ac.ServiceApplyConfiguration, keep map[string]bool) {
	svc := toService(s.t, ac)
	keep[svc.Namespace+"/"+svc.Name] = true
	for i := range s.services {
		if s.services[i].Namespace == svc.Namespace && s.services[i].Name == svc.Name {
			if !equality.Semantic.DeepEqual(s.services[i], svc) {
				s.write()
			}
			s.services[i] = svc
			return
		}
	}
	s.write()
	s.services = append(s.services, svc)
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
	s := &guestSim{
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
	for _, obj := range append(s.obs.webhookConfigurations(), &s.obs.APIServices[0], &s.obs.APIServices[1]) {
		obj.SetResourceVersion("1")
	}
	return s
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
	g.Expect(s.writes).To(Equal(7), "2 NodePort Services, 1 ExternalName Service, the host copy of the records, 3 objects")
	g.Expect(s.gwb.Status.Records).To(HaveLen(3))
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
	s.reconcile(g)
	g.Expect(s.writes).To(Equal(1), "the repair (the chart's reference, the new original, is the one the host copy holds)")
	g.Expect(s.obs.ValidatingWebhooks[0].Webhooks[0].ClientConfig.URL).To(Equal(ptr.To(cmValidateURL)))
	g.Expect(s.obs.ValidatingWebhooks[0].Webhooks[0].ClientConfig.CABundle).To(Equal([]byte("ca-2")))
	s.reconcile(g)
	g.Expect(s.writes).To(BeZero())

	// The mutating webhook is dropped from the bridge: restored, the others stay; its
	// record leaves the host copy once the restore landed.
	s.gwb.Spec.MutatingWebhooks = nil
	s.reconcile(g)
	g.Expect(s.writes).To(Equal(2))
	g.Expect(s.gwb.Status.Records).To(HaveLen(2))
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
	g.Expect(s.writes).To(Equal(4), "NodePort and ExternalName Services, the host copy, the APIService")
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
	g.Expect(s.writes).To(Equal(2), "the record is dropped, in both copies")
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
