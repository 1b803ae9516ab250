package policy_test

// FuzzBuilders: whatever a tenant writes in a GuestIngress and whatever an admin writes in a
// GuestIngressPolicy, what guestnet would create on the host keeps the tenant inside the
// policy. The fuzzer varies both (comma-separated lists in strings), runs admission and the
// builders (pool, L2 announcement policy, host Service), and checks:
//
//   - always (defense in depth, admitted or not): the pool and the L2 policy select only the
//     GuestIngress's own host Service (io.kubernetes.service.namespace/name); the host
//     Service carries no forbidden label or annotation key, opens no host nodePort
//     (allocateLoadBalancerNodePorts false, no nodePort, no health-check nodePort asked
//     for), has no external IPs or spec.loadBalancerIP, and selects only the Cluster's
//     workers; the L2 policy names interfaces and announces load-balancer IPs only;
//   - when admitted: every pool block lies in an admitted range (or the IP in the shared
//     pool's blocks), no IPv4-mapped IPv6 address, the class is the policy's, Local traffic (the only source of a
//     health-check nodePort) only when the policy allows it, every user key on the Service is
//     allowed, the interfaces are the policy's, the node selector holds the policy's, and no
//     pool but its own (and the shared one) can hand out an IP chosen by LB-IPAM; and what is
//     built is within what is admitted (HeldBeyondAdmitted cuts nothing of it).
//
// Run longer with: go test ./internal/policy -run '^$' -fuzz FuzzBuilders -fuzztime 2m

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// fuzzInput is one GuestIngress and one policy, as the fuzzer varies them.
type fuzzInput struct {
	// GuestIngress
	cluster, ip, cidrs, poolRef, class string
	local                              bool
	ifaces, nodeSel, annKeys, lblKeys  string
	// GuestIngressPolicy
	addresses, classes, pIfaces, pNodeSel, allowAnn, allowLbl, shared string
	allowLocal                                                        bool
	// the shared pool's blocks and selector ("ns:<a>,<b>" pins namespaces, "k=v" a label,
	// "" none), and whether a pool without selector exists too
	poolBlocks, poolSel string
	defaultPool         bool
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func keyMap(s string) map[string]string {
	m := map[string]string{}
	for _, k := range split(s) {
		m[k] = "v"
	}
	return m
}

func selector(s string) *metav1.LabelSelector {
	if s == "" {
		return nil
	}
	ls := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for _, kv := range split(s) {
		k, v, _ := strings.Cut(kv, "=")
		ls.MatchLabels[k] = v
	}
	return ls
}

func (f fuzzInput) build() (*guestnetv1.GuestIngress, guestnetv1.GuestIngressPolicy, policy.PoolMap) {
	gi := &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "web", UID: "uid-web"},
		Spec: guestnetv1.GuestIngressSpec{
			ClusterName:  f.cluster,
			GuestService: guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"},
			Ports:        []guestnetv1.IngressPort{{Name: "http", Port: 80, NodePort: ptr.To[int32](30080)}},
			LoadBalancer: guestnetv1.LoadBalancerSpec{
				IP: f.ip, CIDRs: split(f.cidrs), Class: f.class,
				Annotations: keyMap(f.annKeys), Labels: keyMap(f.lblKeys),
			},
		},
	}
	lb := &gi.Spec.LoadBalancer
	if f.poolRef != "" {
		lb.PoolRef = &guestnetv1.PoolReference{Name: f.poolRef}
	}
	if f.local {
		lb.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	if f.ifaces != "" || f.nodeSel != "" {
		lb.L2 = &guestnetv1.L2AnnouncementSpec{Interfaces: split(f.ifaces), NodeSelector: selector(f.nodeSel)}
	}

	p := guestnetv1.GuestIngressPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: guestnetv1.GuestIngressPolicySpec{
			Addresses:           split(f.addresses),
			LoadBalancerClasses: split(f.classes),
			SharedPools:         split(f.shared),
			HostService: guestnetv1.HostServicePolicy{
				AllowedAnnotationKeys: split(f.allowAnn),
				AllowedLabelKeys:      split(f.allowLbl),
			},
		},
	}
	if f.allowLocal {
		p.Spec.HostService.ExternalTrafficPolicies = []corev1.ServiceExternalTrafficPolicy{"Cluster", "Local"}
	}
	if f.pIfaces != "" {
		sel := selector(f.pNodeSel)
		if sel == nil {
			sel = &metav1.LabelSelector{}
		}
		p.Spec.L2Announcement = &guestnetv1.L2AnnouncementPolicy{Interfaces: split(f.pIfaces), NodeSelector: *sel}
	}

	pools := policy.PoolMap{}
	if f.poolRef != "" {
		pool := ingress.NewPool()
		pool.SetName(f.poolRef)
		var blocks []any
		for _, b := range split(f.poolBlocks) {
			blocks = append(blocks, map[string]any{"cidr": b})
		}
		spec := map[string]any{"blocks": blocks}
		if nss, ok := strings.CutPrefix(f.poolSel, "ns:"); ok {
			var vals []any
			for _, ns := range split(nss) {
				vals = append(vals, ns)
			}
			spec["serviceSelector"] = map[string]any{"matchExpressions": []any{
				map[string]any{"key": ingress.ServiceNamespaceKey, "operator": "In", "values": vals}}}
		} else if sel := selector(f.poolSel); sel != nil {
			m, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(sel)
			spec["serviceSelector"] = m
		}
		pool.Object["spec"] = spec
		pools[f.poolRef] = pool
	}
	if f.defaultPool {
		def := ingress.NewPool()
		def.SetName("zz-default")
		def.Object["spec"] = map[string]any{"blocks": []any{map[string]any{"cidr": "192.168.0.0/24"}}}
		pools[def.GetName()] = def
	}
	return gi, p, pools
}

func FuzzBuilders(f *testing.F) {
	seeds := []fuzzInput{
		// What the quick start writes.
		{cluster: "tenant-a", ip: "10.2.6.220", class: "io.cilium/l2-announcer", addresses: "10.2.6.0/24", pIfaces: "^eth0$", pNodeSel: "lb=true"},
		// The attacks of docs/security.md's threat model.
		{cluster: "tenant-a", ip: "10.0.0.1", cidrs: "0.0.0.0/0", ifaces: "^mgmt0$", addresses: "10.2.6.0/24", pIfaces: "^eth0$"},
		{cluster: "tenant-a", ip: "10.2.6.5", annKeys: "lbipam.cilium.io/ips,lbipam.cilium.io/sharing-key,external-dns.alpha.kubernetes.io/hostname",
			lblKeys: "cluster.x-k8s.io/cluster-name,io.kubernetes.service.namespace", addresses: "10.2.6.0/24", pIfaces: "^eth0$",
			allowAnn: "lbipam.cilium.io/*,external-dns.alpha.kubernetes.io/*", allowLbl: "io.kubernetes.service.namespace"},
		{cluster: "victim", cidrs: "10.2.6.8/29", addresses: "10.2.6.0/24", pIfaces: "^eth0$", defaultPool: true},
		{cluster: "tenant-a", poolRef: "infra", addresses: "10.2.6.0/24", pIfaces: "^eth0$", shared: "shared", poolBlocks: "10.1.0.0/24"},
		{cluster: "tenant-a", ip: "10.1.0.9", poolRef: "shared", addresses: "10.2.6.0/24", pIfaces: "^eth0$", shared: "shared",
			poolBlocks: "10.1.0.0/24", poolSel: "cluster.x-k8s.io/cluster-name=tenant-a"},
		{cluster: "tenant-a", ip: "10.1.0.9", poolRef: "shared", addresses: "10.2.6.0/24", pIfaces: "^eth0$", shared: "shared",
			poolBlocks: "10.1.0.0/24", poolSel: "ns:tenant-a,tenant-b"},
		{cluster: "tenant-a", ip: "10.2.6.7", local: true, class: "io.cilium/bgp-control-plane", classes: "io.cilium/bgp-control-plane",
			addresses: "10.2.6.0/24", allowLocal: true},
		{cluster: "tenant-a", ip: "fd00::7", cidrs: "fd00::/124", ifaces: "^bond0$", nodeSel: "zone=a,lb=false",
			addresses: "fd00::/120", pIfaces: "^eth0$,^bond0$", pNodeSel: "lb=true", annKeys: "example.com/team", allowAnn: "example.com/*"},
	}
	for _, s := range seeds {
		f.Add(s.cluster, s.ip, s.cidrs, s.poolRef, s.class, s.local, s.ifaces, s.nodeSel, s.annKeys, s.lblKeys,
			s.addresses, s.classes, s.pIfaces, s.pNodeSel, s.allowAnn, s.allowLbl, s.shared, s.allowLocal, s.poolBlocks, s.poolSel, s.defaultPool)
	}
	f.Fuzz(func(t *testing.T, cluster, ip, cidrs, poolRef, class string, local bool, ifaces, nodeSel, annKeys, lblKeys,
		addresses, classes, pIfaces, pNodeSel, allowAnn, allowLbl, shared string, allowLocal bool, poolBlocks, poolSel string, defaultPool bool) {
		in := fuzzInput{cluster, ip, cidrs, poolRef, class, local, ifaces, nodeSel, annKeys, lblKeys,
			addresses, classes, pIfaces, pNodeSel, allowAnn, allowLbl, shared, allowLocal, poolBlocks, poolSel, defaultPool}
		checkBuilders(t, in)
	})
}

func checkBuilders(t *testing.T, in fuzzInput) {
	gi, p, pools := in.build()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tenant-a", Labels: map[string]string{"kubernetes.io/metadata.name": "tenant-a"}}}
	d := policy.Admit(policy.Input{GuestIngress: gi, Namespace: ns, Policies: []guestnetv1.GuestIngressPolicy{p}, Pools: pools})

	svcName := hostnames.HostService(gi)
	ownSelector := map[string]any{"matchLabels": map[string]any{ingress.ServiceNamespaceKey: "tenant-a", ingress.ServiceNameKey: svcName}}

	// --- always --------------------------------------------------------------------------
	svc := hostService(t, gi)
	if svc.Spec.AllocateLoadBalancerNodePorts == nil || *svc.Spec.AllocateLoadBalancerNodePorts {
		t.Fatalf("host Service allocates nodePorts: %v", svc.Spec.AllocateLoadBalancerNodePorts)
	}
	for _, port := range svc.Spec.Ports {
		if port.NodePort != 0 {
			t.Fatalf("host Service asks for nodePort %d", port.NodePort)
		}
	}
	if svc.Spec.HealthCheckNodePort != 0 || len(svc.Spec.ExternalIPs) > 0 || svc.Spec.LoadBalancerIP != "" {
		t.Fatalf("host Service asks for a health-check nodePort, external IPs or spec.loadBalancerIP: %+v", svc.Spec)
	}
	if want := virtlauncher.WorkerSelector(gi.Namespace, gi.Spec.ClusterName); ingress.Local(gi) && len(svc.Spec.Selector) > 0 {
		t.Fatalf("host Service of externalTrafficPolicy Local selects %v: guestnet writes its endpoints", svc.Spec.Selector)
	} else if !ingress.Local(gi) && !equalMaps(svc.Spec.Selector, want) {
		t.Fatalf("host Service selects %v, not the Cluster's workers %v", svc.Spec.Selector, want)
	}
	own := ownership.Labels(gi)
	for k, v := range svc.Labels {
		if ingress.ForbiddenHostServiceKey(k) && own[k] != v {
			t.Fatalf("forbidden label %s=%s on the host Service", k, v)
		}
	}
	for k, v := range svc.Annotations {
		if ingress.ForbiddenHostServiceKey(k) && (k != ingress.LBIPAMIPsAnnotation || v != gi.Spec.LoadBalancer.IP) {
			t.Fatalf("forbidden annotation %s=%s on the host Service", k, v)
		}
	}
	pool := ingress.Pool(gi)
	if pool != nil && !equalAny(pool.Object["spec"].(map[string]any)["serviceSelector"], ownSelector) {
		t.Fatalf("pool selects %v, not only its own host Service", pool.Object["spec"])
	}
	l2, err := ingress.L2Policy(gi, d.Announcement)
	if err == nil && l2 != nil {
		spec := l2.Object["spec"].(map[string]any)
		if !equalAny(spec["serviceSelector"], ownSelector) {
			t.Fatalf("L2 policy selects %v, not only its own host Service", spec["serviceSelector"])
		}
		if ifs, _ := spec["interfaces"].([]any); len(ifs) == 0 {
			t.Fatalf("L2 policy on every interface: %v", spec)
		}
		if _, ok := spec["externalIPs"]; ok || spec["loadBalancerIPs"] != any(true) {
			t.Fatalf("L2 policy announces more than load-balancer IPs: %v", spec)
		}
	}

	if !d.Admitted {
		if d.Policy != "" || len(d.Announcement.Interfaces) > 0 || d.Message == "" {
			t.Fatalf("a refusal must claim nothing and say why: %+v", d)
		}
		return
	}

	// --- admitted ------------------------------------------------------------------------
	lb := gi.Spec.LoadBalancer
	if a, err := netip.ParseAddr(lb.IP); err == nil && a.Is4In6() {
		t.Fatalf("admitted the IPv4-mapped address %s", lb.IP)
	}
	if lb.PoolRef == nil {
		allowed := policy.Addresses(&p)
		for _, b := range ingress.PoolRanges(pool) {
			if !slices.ContainsFunc(allowed, func(a netip.Prefix) bool { return a.Contains(b.From) && a.Contains(b.To) }) {
				t.Fatalf("pool block %v-%v outside the admitted ranges %v", b.From, b.To, p.Spec.Addresses)
			}
		}
		if len(ingress.PoolRanges(pool)) == 0 {
			t.Fatalf("admitted with an empty pool: %+v", lb)
		}
	} else {
		if !slices.Contains(p.Spec.SharedPools, lb.PoolRef.Name) {
			t.Fatalf("poolRef %s not offered by the policy", lb.PoolRef.Name)
		}
		if _, pinned, _ := ingress.PoolNamespaces(pools[lb.PoolRef.Name]); !pinned {
			t.Fatalf("shared pool %s not pinned to namespaces", lb.PoolRef.Name)
		}
		if lb.IP != "" && !ingress.RangesContain(ingress.PoolRanges(pools[lb.PoolRef.Name]), netip.MustParseAddr(lb.IP)) {
			t.Fatalf("IP %s outside shared pool %s", lb.IP, lb.PoolRef.Name)
		}
	}
	if lb.IP == "" {
		for name, other := range pools {
			if (lb.PoolRef != nil && name == lb.PoolRef.Name) || ownership.IsOwnedBy(other, gi) {
				continue
			}
			if ok, _ := ingress.SelectorMatchesService(other, svc.Labels, "tenant-a", svcName); ok {
				t.Fatalf("admitted without a fixed IP while pool %s could hand one out", name)
			}
		}
	}
	if !slices.Contains(policy.Classes(&p), ingress.LoadBalancerClass(gi)) {
		t.Fatalf("class %s not admitted", ingress.LoadBalancerClass(gi))
	}
	if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal && !slices.Contains(policy.TrafficPolicies(&p), corev1.ServiceExternalTrafficPolicyLocal) {
		t.Fatalf("Local traffic (a health-check nodePort) without the policy allowing it")
	}
	for k := range svc.Labels {
		if _, guestnets := own[k]; !guestnets && !policy.KeyAllowed(k, p.Spec.HostService.AllowedLabelKeys) {
			t.Fatalf("label %s not allowed by the policy", k)
		}
	}
	for k := range svc.Annotations {
		if k != ingress.LBIPAMIPsAnnotation && !policy.KeyAllowed(k, p.Spec.HostService.AllowedAnnotationKeys) {
			t.Fatalf("annotation %s not allowed by the policy", k)
		}
	}
	if ingress.AnnouncesL2(gi) {
		if err != nil || l2 == nil {
			t.Fatalf("admitted but no L2 policy can be built: %v", err)
		}
		for _, i := range d.Announcement.Interfaces {
			if !slices.Contains(p.Spec.L2Announcement.Interfaces, i) {
				t.Fatalf("interface %s not the policy's %v", i, p.Spec.L2Announcement.Interfaces)
			}
		}
		ps := p.Spec.L2Announcement.NodeSelector
		got := d.Announcement.NodeSelector
		for k, v := range ps.MatchLabels {
			if got == nil || got.MatchLabels[k] != v {
				t.Fatalf("node selector %v lacks the policy's %s=%s", got, k, v)
			}
		}
		for _, r := range ps.MatchExpressions {
			if got == nil || !slices.ContainsFunc(got.MatchExpressions, func(x metav1.LabelSelectorRequirement) bool { return equalAny(x, r) }) {
				t.Fatalf("node selector %v lacks the policy's %v", got, r)
			}
		}
	} else if l2 != nil {
		t.Fatalf("an L2 policy for class %s", ingress.LoadBalancerClass(gi))
	}

	// What guestnet builds for what is admitted is within it: the held check
	// (HeldBeyondAdmitted) never takes off what the next apply puts back.
	held := policy.Held{HostService: svc, Pool: pool, L2Policy: l2}
	if ip, err := netip.ParseAddr(lb.IP); err == nil {
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip.String()}}
	}
	if e := policy.HeldBeyondAdmitted(in.input(gi, ns, p, pools), d, held); !e.None() {
		t.Fatalf("what guestnet builds for an admitted GuestIngress is not within what is admitted: %q %q %q",
			e.HostService.Outside, e.Pool.Outside, e.L2Policy.Outside)
	}
}

// input is the admission input of the fuzzed GuestIngress.
func (fuzzInput) input(gi *guestnetv1.GuestIngress, ns *corev1.Namespace, p guestnetv1.GuestIngressPolicy, pools policy.PoolMap) policy.Input {
	return policy.Input{GuestIngress: gi, Namespace: ns, Policies: []guestnetv1.GuestIngressPolicy{p}, Pools: pools}
}

func hostService(t *testing.T, gi *guestnetv1.GuestIngress) *corev1.Service {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ingress.HostService(gi, map[string]int32{"http": 30080}, ingress.Admission{}))
	if err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u, svc); err != nil {
		t.Fatal(err)
	}
	return svc
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// equalAny compares two values by their JSON (map keys sorted).
func equalAny(a, b any) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}
