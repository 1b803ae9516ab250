package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
)

// Options are the agent's flags.
type Options struct {
	// NodeName is the agent's own Node (the DaemonSet passes spec.nodeName).
	NodeName string
	// Remove takes off what the agent put in the kernel and keeps it off (the opt-out).
	Remove bool
	// HealthPort is where the agent serves /readyz on 127.0.0.1 (the kubelet's readiness
	// probe) and /healthz on the node IP (what /readyz dials: the node IP works inside the VM).
	HealthPort int
	// ResyncEvery is how often the agent checks the kernel again without a Node event (an
	// admin's `nft flush ruleset`, a network manager that took lo's addresses).
	ResyncEvery time.Duration
	// MetricsBindAddress, when set, serves /metrics there too (it is always served on
	// 127.0.0.1:HealthPort): a guest Prometheus scrapes the agent at its node IP.
	MetricsBindAddress string
}

// Run runs the agent until ctx ends. It never cleans up on the way out: the kernel is its
// state, kept across restarts of the agent; only --remove takes it off.
func Run(ctx context.Context, config *rest.Config, o Options, log logr.Logger) error {
	if o.NodeName == "" {
		return errors.New("node-agent: --node-name is required (the DaemonSet passes spec.nodeName)")
	}
	if o.ResyncEvery <= 0 {
		o.ResyncEvery = 30 * time.Second
	}
	a := &agent{o: o, log: log, wake: make(chan struct{}, 1), metrics: newAgentMetrics()}
	probe, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(o.HealthPort)))
	if err != nil {
		return fmt.Errorf("node-agent: serving /readyz: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", a.readyz)
	mux.Handle("/metrics", a.metrics.handler())
	go a.serve(ctx, probe, mux)
	if o.MetricsBindAddress != "" {
		l, err := net.Listen("tcp", o.MetricsBindAddress)
		if err != nil {
			return fmt.Errorf("node-agent: serving /metrics: %w", err)
		}
		go a.serve(ctx, l, a.metrics.handler())
	}

	var store toolscache.Store
	if !o.Remove {
		cs, err := kubernetes.NewForConfig(config)
		if err != nil {
			return err
		}
		lw := toolscache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "nodes", "", fields.OneTermEqualSelector("metadata.name", o.NodeName))
		informer := toolscache.NewSharedIndexInformer(lw, &corev1.Node{}, 0, toolscache.Indexers{})
		if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { a.poke() },
			UpdateFunc: func(any, any) { a.poke() },
			DeleteFunc: func(any) { a.poke() },
		}); err != nil {
			return err
		}
		go informer.Run(ctx.Done())
		store = informer.GetStore()
	}
	a.poke()
	tick := time.NewTicker(o.ResyncEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			a.stopProof()
			return nil
		case <-tick.C:
		case <-a.wake:
		}
		a.sync(ctx, store)
	}
}

// agent is the running agent's state.
type agent struct {
	o    Options
	log  logr.Logger
	wake chan struct{}

	metrics *agentMetrics

	mu sync.Mutex
	// ready and why are what /readyz answers.
	ready bool
	why   string
	// proof serves /healthz on the node IP.
	proof     net.Listener
	proofAddr string
}

func (a *agent) poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

func (a *agent) setReady(ready bool, why string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ready != ready || a.why != why {
		a.log.Info("Readiness", "ready", ready, "why", why)
	}
	a.ready, a.why = ready, why
}

// sync brings the kernel to what the Node says, and readiness with it; its result is counted.
func (a *agent) sync(ctx context.Context, store toolscache.Store) {
	result, ready, why := a.syncKernel(ctx, store)
	a.setReady(ready, why)
	a.metrics.synced(result, ready, time.Now())
}

// syncKernel does the work of sync and says how it went: the result, and readiness.
func (a *agent) syncKernel(ctx context.Context, store toolscache.Store) (result string, ready bool, why string) {
	if a.o.Remove {
		changed, err := RemoveFromKernel()
		if err != nil {
			return SyncError, false, err.Error()
		}
		if changed {
			a.log.Info("Removed the node IP from lo and table ip " + TableName)
		}
		a.stopProof()
		if changed {
			return SyncChanged, true, "removed"
		}
		return SyncRemoved, true, "removed"
	}
	obj, exists, err := store.GetByKey(a.o.NodeName)
	if err != nil || !exists {
		return SyncWaiting, false, "waiting for Node " + a.o.NodeName
	}
	node := obj.(*corev1.Node) //nolint:forcetypeassert // the informer's type
	nodeIP := firstIPv4InternalIP(node)
	if nodeIP == nil {
		return SyncWaiting, false, "Node " + node.Name + " has no IPv4 InternalIP yet (guestnet writes it from the VM's pod IP)"
	}
	uplink, vmAddress, err := Uplink()
	if err != nil {
		return SyncError, false, err.Error()
	}
	k := Kernel{NodeIP: nodeIP, Uplink: uplink, VMAddress: vmAddress}
	if nodeIP.Equal(vmAddress) {
		return SyncWaiting, false, fmt.Sprintf("Node %s's InternalIP is the VM's own address %s: its kubelet set it (not in external cloud-provider mode); nothing to do until guestnet writes the pod IP", node.Name, nodeIP)
	}
	changed, err := k.Apply()
	if err != nil {
		return SyncError, false, err.Error()
	}
	result = SyncUnchanged
	if changed {
		a.log.Info("Kernel updated", "state", k.String())
		result = SyncChanged
	}
	if err := a.ensureProof(ctx, nodeIP); err != nil {
		return SyncError, false, err.Error()
	}
	if err := a.checkProof(ctx); err != nil {
		return SyncError, false, "a request to the node IP from inside the VM fails: " + err.Error()
	}
	return result, true, k.String()
}

// ensureProof serves /healthz on nodeIP:HealthPort (and on nothing else).
func (a *agent) ensureProof(ctx context.Context, nodeIP net.IP) error {
	addr := net.JoinHostPort(nodeIP.String(), strconv.Itoa(a.o.HealthPort))
	a.mu.Lock()
	same := a.proof != nil && a.proofAddr == addr
	a.mu.Unlock()
	if same {
		return nil
	}
	a.stopProof()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("binding the node IP inside the VM: %w", err)
	}
	a.mu.Lock()
	a.proof, a.proofAddr = l, addr
	a.mu.Unlock()
	go a.serve(ctx, l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	return nil
}

func (a *agent) stopProof() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proof != nil {
		_ = a.proof.Close()
		a.proof, a.proofAddr = nil, ""
	}
}

// checkProof dials the node IP as the kubelet's probes of hostNetwork pods do.
func (a *agent) checkProof(ctx context.Context) error {
	a.mu.Lock()
	addr := a.proofAddr
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", http.NoBody)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}

func (a *agent) readyz(w http.ResponseWriter, _ *http.Request) {
	a.mu.Lock()
	ready, why := a.ready, a.why
	a.mu.Unlock()
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write([]byte(why + "\n"))
}

func (a *agent) serve(ctx context.Context, l net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		a.log.Error(err, "Serving", "address", l.Addr().String())
	}
}

// firstIPv4InternalIP is the Node's first IPv4 InternalIP (nil when none).
func firstIPv4InternalIP(node *corev1.Node) net.IP {
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip := net.ParseIP(a.Address); ip != nil && ip.To4() != nil {
			return ip.To4()
		}
	}
	return nil
}
