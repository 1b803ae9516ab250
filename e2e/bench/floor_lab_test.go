package bench_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// The floor: what the apiservers allow. With the manager stopped, the objects guestnet wrote
// for each GuestIngress (the guest Service's type and nodePorts, the pool, the L2 policy,
// the host Service) are taken away; a plain client with the manager's budget (host QPS 100,
// burst 200; one write per guest, well within each guest's 20 QPS) writes them again, as
// guestnet wrote them, with one status write per GuestIngress, 10 members at a time (the
// manager's GuestIngress concurrency); then they are taken away again and the manager is
// started on the fleet. Both are timed from their start until every member is exposed: its
// host Service has its IP and a ready endpoint, and its guest Service has the fixed
// nodePorts. Bridges are left as they are (not part of the floor).

// FloorResult compares the plain client with guestnet on the same objects, in seconds.
type FloorResult struct {
	GuestIngresses int `json:"guestIngresses"`
	// FloorWrites is how many writes the plain client made.
	FloorWrites int     `json:"floorWrites"`
	FloorAll    float64 `json:"floorAllSeconds"`
	FloorP50    float64 `json:"floorP50Seconds"`
	FloorP99    float64 `json:"floorP99Seconds"`
	// Guestnet: the manager started on the fleet whose objects were taken away (its process
	// start, cache sync and guest connections included).
	GuestnetAll float64 `json:"guestnetAllSeconds"`
	GuestnetP50 float64 `json:"guestnetP50Seconds"`
	GuestnetP99 float64 `json:"guestnetP99Seconds"`
	// Ratio is GuestnetAll / FloorAll.
	Ratio float64 `json:"ratio"`
	// FloorCPU and GuestnetCPU are the CPU seconds every process of the lab used over each
	// of the two spans, by command (lab.CPUByCommand; the host's apiserver apart from the
	// guest shards'): on a machine the lab saturates, what a member costs the lab bounds both.
	FloorCPU    map[string]float64 `json:"floorCpuSeconds,omitempty"`
	GuestnetCPU map[string]float64 `json:"guestnetCpuSeconds,omitempty"`
}

// measureFloor runs the floor and guestnet's restart on the fleet, with the manager stopped
// at the start; startManager starts it and returns what stops it.
func measureFloor(ctx context.Context, t *testing.T, l *lab.Lab, members []*lab.FleetMember, startManager func() (stop func())) (*FloorResult, error) {
	objs, err := snapshotMembers(ctx, l, members)
	if err != nil {
		return nil, err
	}
	limit := 5*time.Minute + time.Duration(len(objs))*time.Second
	if err := takeAway(ctx, l, objs); err != nil {
		return nil, err
	}
	f := &FloorResult{GuestIngresses: len(objs)}
	cpu := labCPU(l)
	start := time.Now()
	started, writes, err := writeFloor(ctx, l, objs)
	if err != nil {
		return nil, err
	}
	exposed, err := waitExposed(ctx, l, objs, limit)
	if err != nil {
		return nil, err
	}
	f.FloorCPU = cpu.since()
	f.FloorWrites = writes
	f.FloorAll, f.FloorP50, f.FloorP99 = spans(start, started, exposed)
	t.Logf("floor: %d writes, all exposed after %.1f s", writes, f.FloorAll)

	if err := takeAway(ctx, l, objs); err != nil {
		return nil, err
	}
	cpu = labCPU(l)
	start = time.Now()
	stop := startManager()
	defer stop()
	exposed, err = waitExposed(ctx, l, objs, limit)
	if err != nil {
		return nil, err
	}
	f.GuestnetCPU = cpu.since()
	f.GuestnetAll, f.GuestnetP50, f.GuestnetP99 = spans(start, nil, exposed)
	if f.FloorAll > 0 {
		f.Ratio = f.GuestnetAll / f.FloorAll
	}
	t.Logf("guestnet restarted: all exposed after %.1f s (%.2f x the floor)", f.GuestnetAll, f.Ratio)
	return f, nil
}

// cpuReading is the lab's CPU use by command at one moment.
type cpuReading struct {
	pids   map[int]string
	before map[string]float64
}

// labCPU reads the lab's CPU use now; the host's apiserver is named apart from the shards'.
func labCPU(l *lab.Lab) cpuReading {
	r := cpuReading{pids: map[int]string{l.Host.PID(): "kube-apiserver (host)"}}
	r.before, _ = lab.CPUByCommand(r.pids) // (no figures is no reason to stop the bench)
	return r
}

// since is the CPU seconds used by command since the reading (a process started since
// counts from zero).
func (r cpuReading) since() map[string]float64 {
	now, err := lab.CPUByCommand(r.pids)
	if err != nil {
		return nil
	}
	out := map[string]float64{}
	for name, seconds := range now {
		if d := seconds - r.before[name]; d >= 0.05 {
			out[name] = d
		}
	}
	return out
}

// memberObjects are the objects guestnet wrote for one member's GuestIngress, as written.
type memberObjects struct {
	m            *lab.FleetMember
	hostService  *corev1.Service
	pool, l2     *unstructured.Unstructured
	guestService *corev1.Service
}

// snapshotMembers reads the objects guestnet wrote for every member.
func snapshotMembers(ctx context.Context, l *lab.Lab, members []*lab.FleetMember) ([]*memberObjects, error) {
	var out []*memberObjects
	for _, m := range members {
		gi := m.GuestIngress
		o := &memberObjects{m: m, hostService: &corev1.Service{}, pool: ingress.NewPool(), l2: ingress.NewL2Policy(), guestService: &corev1.Service{}}
		for _, get := range []struct {
			c   client.Client
			key client.ObjectKey
			obj client.Object
		}{
			{l.Host.Client, client.ObjectKey{Namespace: gi.Namespace, Name: hostnames.HostService(gi)}, o.hostService},
			{l.Host.Client, client.ObjectKey{Name: hostnames.Pool(gi)}, o.pool},
			{l.Host.Client, client.ObjectKey{Name: hostnames.L2Policy(gi)}, o.l2},
			{m.Guest.Client, client.ObjectKey{Namespace: gi.Spec.GuestService.Namespace, Name: gi.Spec.GuestService.Name}, o.guestService},
		} {
			if err := get.c.Get(ctx, get.key, get.obj); err != nil {
				return nil, fmt.Errorf("member %d: %w", m.Index, err)
			}
		}
		out = append(out, o)
	}
	return out, nil
}

// takeAway deletes the host objects and gives the guest Service back its ClusterIP type, and
// waits until the host Services are gone.
func takeAway(ctx context.Context, l *lab.Lab, objs []*memberObjects) error {
	for _, o := range objs {
		for _, obj := range []client.Object{o.hostService.DeepCopy(), o.pool.DeepCopy(), o.l2.DeepCopy()} {
			if err := l.Host.Client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
		svc := &corev1.Service{}
		guest := o.m.Guest.Client
		if err := guest.Get(ctx, client.ObjectKeyFromObject(o.guestService), svc); err != nil {
			return err
		}
		svc.Spec.Type = corev1.ServiceTypeClusterIP
		for i := range svc.Spec.Ports {
			svc.Spec.Ports[i].NodePort = 0
		}
		if err := guest.Update(ctx, svc); err != nil {
			return err
		}
	}
	for _, o := range objs {
		for {
			err := l.Host.Client.Get(ctx, client.ObjectKeyFromObject(o.hostService), &corev1.Service{})
			if apierrors.IsNotFound(err) {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// writeFloor writes every member's objects as guestnet wrote them, with a plain client of the
// manager's QPS budget, and returns when each member's writes started and how many it made.
func writeFloor(ctx context.Context, l *lab.Lab, objs []*memberObjects) (map[int]time.Time, int, error) {
	cfg := rest.CopyConfig(l.Host.Config)
	cfg.QPS, cfg.Burst = 100, 200
	host, err := client.New(cfg, client.Options{Scheme: lab.Scheme})
	if err != nil {
		return nil, 0, err
	}
	started := map[int]time.Time{}
	var mu sync.Mutex
	writes := 0
	work := make(chan *memberObjects)
	errs := make(chan error, len(objs))
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			for o := range work {
				mu.Lock()
				started[o.m.Index] = time.Now()
				mu.Unlock()
				n, err := writeMember(ctx, host, o.m.Guest.Client, o)
				mu.Lock()
				writes += n
				mu.Unlock()
				if err != nil {
					errs <- fmt.Errorf("member %d: %w", o.m.Index, err)
				}
			}
		})
	}
	for _, o := range objs {
		work <- o
	}
	close(work)
	wg.Wait()
	close(errs)
	return started, writes, <-errs
}

// writeMember applies one member's guest Service type and nodePorts, pool, L2 policy and
// host Service (server-side apply, field manager bench-floor), and writes its GuestIngress's
// status once.
func writeMember(ctx context.Context, host, guest client.Client, o *memberObjects) (int, error) {
	writes := 0
	gsvc := &corev1.Service{}
	gsvc.Namespace, gsvc.Name = o.guestService.Namespace, o.guestService.Name
	gsvc.Spec.Type = o.guestService.Spec.Type
	for _, p := range o.guestService.Spec.Ports {
		gsvc.Spec.Ports = append(gsvc.Spec.Ports, corev1.ServicePort{Name: p.Name, Port: p.Port, NodePort: p.NodePort})
	}
	hsvc := o.hostService.DeepCopy()
	hsvc.Spec.ClusterIP, hsvc.Spec.ClusterIPs = "", nil
	for _, w := range []struct {
		c   client.Client
		obj *unstructured.Unstructured
	}{
		{guest, asApplied(serviceObject(gsvc))},
		{host, asApplied(o.pool)},
		{host, asApplied(o.l2)},
		{host, asApplied(serviceObject(hsvc))},
	} {
		writes++
		if err := w.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(w.obj), client.FieldOwner("bench-floor"), client.ForceOwnership); err != nil {
			return writes, fmt.Errorf("applying %s %s: %w", w.obj.GetKind(), w.obj.GetName(), err)
		}
	}
	gi := o.m.GuestIngress.DeepCopy()
	writes++
	return writes, host.Status().Patch(ctx, gi, client.RawPatch(types.MergePatchType, []byte(`{"status":{}}`)))
}

func serviceObject(svc *corev1.Service) *unstructured.Unstructured {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(svc)
	if err != nil {
		panic(err) // a Service always converts
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion("v1")
	u.SetKind("Service")
	return u
}

// asApplied is obj without what the apiserver set, to be applied again.
func asApplied(obj *unstructured.Unstructured) *unstructured.Unstructured {
	u := obj.DeepCopy()
	for _, f := range []string{"resourceVersion", "uid", "managedFields", "creationTimestamp", "generation"} {
		unstructured.RemoveNestedField(u.Object, "metadata", f)
	}
	delete(u.Object, "status")
	return u
}

// waitExposed polls (every 200 ms) until every member is exposed and returns when each was
// first seen so.
func waitExposed(ctx context.Context, l *lab.Lab, objs []*memberObjects, limit time.Duration) (map[int]time.Time, error) {
	deadline := time.Now().Add(limit)
	exposed := map[int]time.Time{}
	var guests []*lab.Cluster // the members' guest apiservers (shards)
	for _, o := range objs {
		if !slices.Contains(guests, o.m.Guest) {
			guests = append(guests, o.m.Guest)
		}
	}
	for len(exposed) < len(objs) {
		if time.Now().After(deadline) {
			return exposed, fmt.Errorf("only %d of %d members exposed after %v", len(exposed), len(objs), limit)
		}
		services := &corev1.ServiceList{}
		endpointSlices := &discoveryv1.EndpointSliceList{}
		if err := l.Host.Client.List(ctx, services, client.MatchingLabels{ownership.ManagedByLabel: ownership.ManagedByValue}); err != nil {
			return nil, err
		}
		if err := l.Host.Client.List(ctx, endpointSlices, client.MatchingLabels{ownership.ManagedByLabel: ownership.ManagedByValue}); err != nil {
			return nil, err
		}
		// Guest Services by guest: the members' guest namespaces differ, but each guest is
		// its own cluster.
		fixed := map[*lab.Cluster]map[client.ObjectKey]bool{}
		for _, guest := range guests {
			guestServices := &corev1.ServiceList{}
			if err := guest.Client.List(ctx, guestServices); err != nil {
				return nil, err
			}
			fixed[guest] = map[client.ObjectKey]bool{}
			for i := range guestServices.Items {
				svc := &guestServices.Items[i]
				fixed[guest][client.ObjectKeyFromObject(svc)] = svc.Spec.Type != corev1.ServiceTypeClusterIP
			}
		}
		now := time.Now()
		withIP := map[client.ObjectKey]bool{}
		for i := range services.Items {
			if len(services.Items[i].Status.LoadBalancer.Ingress) > 0 {
				withIP[client.ObjectKeyFromObject(&services.Items[i])] = true
			}
		}
		ready := map[client.ObjectKey]bool{}
		for i := range endpointSlices.Items {
			s := &endpointSlices.Items[i]
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					ready[client.ObjectKey{Namespace: s.Namespace, Name: s.Labels[discoveryv1.LabelServiceName]}] = true
				}
			}
		}
		for _, o := range objs {
			key := client.ObjectKeyFromObject(o.hostService)
			if _, done := exposed[o.m.Index]; !done && withIP[key] && ready[key] && fixed[o.m.Guest][client.ObjectKeyFromObject(o.guestService)] {
				exposed[o.m.Index] = now
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return exposed, nil
}

// spans are the seconds from each member's start to its exposure (p50, p99) and from the
// first start to the last exposure.
func spans(start time.Time, started, exposed map[int]time.Time) (all, p50, p99 float64) {
	var times []float64
	last := start
	for i, at := range exposed {
		s := start
		if t, ok := started[i]; ok {
			s = t
		}
		times = append(times, at.Sub(s).Seconds())
		if at.After(last) {
			last = at
		}
	}
	sort.Float64s(times)
	if len(times) == 0 {
		return 0, 0, 0
	}
	return last.Sub(start).Seconds(), quantile(times, 0.5), quantile(times, 0.99)
}

// LatencyMs is how long the apiservers took to answer requests of one kind, in ms.
type LatencyMs struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean"`
	P99   float64 `json:"p99"`
}

// latencies are the apiservers' answer times of reqs (watches apart), by verb and resource.
func latencies(reqs []lab.AuditRequest) map[string]LatencyMs {
	byKind := map[string][]float64{}
	for _, q := range reqs {
		ms, ok := answerMs(q)
		if q.Verb == "watch" || !ok {
			continue
		}
		key := q.Verb + " " + q.Resource()
		byKind[key] = append(byKind[key], ms)
	}
	out := map[string]LatencyMs{}
	for key, ms := range byKind {
		sort.Float64s(ms)
		sum := 0.0
		for _, m := range ms {
			sum += m
		}
		out[key] = LatencyMs{Count: len(ms), Mean: sum / float64(len(ms)), P99: quantile(ms, 0.99)}
	}
	return out
}

// answerMs is how long the apiserver took to answer q, in ms; false when the log holds no
// answer for it.
func answerMs(q lab.AuditRequest) (float64, bool) {
	if q.Received.IsZero() || q.Answered.IsZero() {
		return 0, false
	}
	return float64(q.Answered.Sub(q.Received).Microseconds()) / 1000, true
}

// TimelineMinute is one minute of the restarted manager's requests, counted from its first.
type TimelineMinute struct {
	Minute int `json:"minute"`
	// Requests (watches apart), of them writes apart from events, and events.
	Requests int `json:"requests"`
	Writes   int `json:"writes"`
	Events   int `json:"events"`
	// MeanMs is the apiservers' mean time to answer those whose answer the log holds.
	MeanMs float64 `json:"meanMs"`
}

// timeline counts reqs by the minute they were received in, from the first one on.
func timeline(reqs []lab.AuditRequest) []TimelineMinute {
	var first time.Time
	for _, q := range reqs {
		if q.Verb != "watch" && !q.Received.IsZero() && (first.IsZero() || q.Received.Before(first)) {
			first = q.Received
		}
	}
	var out []TimelineMinute
	var sums []float64
	var timed []int
	for _, q := range reqs {
		if q.Verb == "watch" || q.Received.IsZero() {
			continue
		}
		m := int(q.Received.Sub(first) / time.Minute)
		for len(out) <= m {
			out = append(out, TimelineMinute{Minute: len(out)})
			sums, timed = append(sums, 0), append(timed, 0)
		}
		out[m].Requests++
		switch {
		case q.Write() && q.Resource() == "events":
			out[m].Events++
		case q.Write():
			out[m].Writes++
		}
		if ms, ok := answerMs(q); ok {
			sums[m] += ms
			timed[m]++
		}
	}
	for i := range out {
		if timed[i] > 0 {
			out[i].MeanMs = sums[i] / float64(timed[i])
		}
	}
	return out
}

// restartMarkdown is the restarted manager's requests: by kind with the apiservers' answer
// times, and per minute.
func restartMarkdown(r Result) string {
	if len(r.RestartRequests) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nN=%d, the restart (until every member was exposed): requests, and the apiservers' time to answer them (ms):\n\n| request | count | per member | mean (ms) | p99 (ms) |\n|---|---|---|---|---|\n", r.N)
	for _, k := range sortedKeys(r.RestartRequests) {
		l := r.RestartLatency[k]
		fmt.Fprintf(&b, "| %s | %d | %.1f | %.1f | %.1f |\n", k, r.RestartRequests[k], float64(r.RestartRequests[k])/float64(r.N), l.Mean, l.P99)
	}
	if f := r.Floor; f != nil && (len(f.FloorCPU) > 0 || len(f.GuestnetCPU) > 0) {
		fmt.Fprintf(&b, "\nN=%d, CPU seconds the lab's processes used, by command, during the floor (%.0f s) and during guestnet's restart (%.0f s):\n\n| command | floor | guestnet |\n|---|---|---|\n", r.N, f.FloorAll, f.GuestnetAll)
		floorSum, guestnetSum := 0.0, 0.0
		for _, n := range sortedKeys(f.FloorCPU, f.GuestnetCPU) {
			fmt.Fprintf(&b, "| %s | %.1f | %.1f |\n", n, f.FloorCPU[n], f.GuestnetCPU[n])
			floorSum, guestnetSum = floorSum+f.FloorCPU[n], guestnetSum+f.GuestnetCPU[n]
		}
		fmt.Fprintf(&b, "| all | %.1f | %.1f |\n", floorSum, guestnetSum)
	}
	fmt.Fprintf(&b, "\nN=%d, the restart minute by minute:\n\n| minute | requests | writes | events | mean answer (ms) |\n|---|---|---|---|---|\n", r.N)
	for _, m := range r.RestartTimeline {
		fmt.Fprintf(&b, "| %d | %d | %d | %d | %.1f |\n", m.Minute, m.Requests, m.Writes, m.Events, m.MeanMs)
	}
	return b.String()
}
