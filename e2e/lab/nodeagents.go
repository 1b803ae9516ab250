package lab

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/nodeagent"
)

// NodeAgentImage is the image the lab's manager names for guestnet's node agent
// (--node-agent-image); the played guest kubelets run the manager binary for it.
const NodeAgentImage = "ghcr.io/guestnet/cluster-api-addon-provider-guestnet:lab"

// NodeAgents plays, for the kernel workers of one KubeVirt stand-in, what runs guestnet's
// node-agent DaemonSet in a real guest: the DaemonSet controller (one pod per Node whose
// labels its nodeSelector matches and whose taints it tolerates, replaced when the template
// changes, status counts as the controller writes them) and each VM's kubelet (the
// container's args with $(VAR) expanded from its env, spec.nodeName for NODE_NAME, run on the
// host network of the VM: the manager binary in the VM's network namespace; its readiness
// probe dialed in that namespace). Neither a container runtime nor a scheduler runs here.
// Where a kubelet mounts the ServiceAccount's token and the agent uses the in-cluster
// configuration (KUBERNETES_SERVICE_HOST/PORT from the container's env), the stand-in gives
// the agent --kubeconfig with the same server, the guest's CA and a TokenRequest token of the
// pod's ServiceAccount. A DaemonSet that goes takes its processes with it (SIGKILL: an agent
// never cleans up on the way out), and the namespace controller's deletion of the agent's
// namespace (finalizeNamespace). Logs: <lab>/node-agent-<machine>-<n>.log.
type NodeAgents struct {
	l  *Lab
	kv *KubeVirt

	mu      sync.Mutex
	running map[string]*agentPod // by machine
	starts  int
	stop    context.CancelFunc
	done    chan struct{}
}

// agentPod is one played agent pod.
type agentPod struct {
	p          *process
	worker     *Worker
	generation int64
	ready      bool
}

// StartNodeAgents starts playing the node agents of kv's workers until the lab stops.
func (l *Lab) StartNodeAgents(ctx context.Context, kv *KubeVirt) *NodeAgents {
	ctx, cancel := context.WithCancel(ctx)
	a := &NodeAgents{l: l, kv: kv, running: map[string]*agentPod{}, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			if err := a.sync(ctx); err != nil && ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "node agents stand-in: %v\n", err)
			}
			select {
			case <-ctx.Done():
				a.stopAll()
				return
			case <-tick.C:
			}
		}
	}()
	l.onStop(a.Stop)
	return a
}

// Stop stops playing the agents and kills their processes.
func (a *NodeAgents) Stop() {
	a.stop()
	<-a.done
}

// Ready reports whether the agent of machine runs the DaemonSet's template and is ready.
func (a *NodeAgents) Ready(machine string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.running[machine]
	return p != nil && p.ready
}

// Running reports whether an agent process runs for machine.
func (a *NodeAgents) Running(machine string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.running[machine] != nil
}

func (a *NodeAgents) stopAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for m, p := range a.running {
		p.kill()
		delete(a.running, m)
	}
}

func (p *agentPod) kill() {
	select {
	case <-p.p.done:
	default:
		_ = p.p.cmd.Process.Kill()
		<-p.p.done
	}
}

// sync is one pass of the played DaemonSet controller and kubelets.
func (a *NodeAgents) sync(ctx context.Context) error {
	guest := a.l.Guest.Client
	if err := a.finalizeNamespace(ctx); err != nil {
		return err
	}
	ds := &appsv1.DaemonSet{}
	err := guest.Get(ctx, client.ObjectKey{Namespace: nodeagent.Namespace, Name: nodeagent.Name}, ds)
	if apierrors.IsNotFound(err) || (err == nil && ds.DeletionTimestamp != nil) {
		a.stopAll()
		return nil
	}
	if err != nil {
		return err
	}
	var eligible []*Worker
	for _, w := range a.kv.Workers() {
		if !w.OnKernelDatapath() {
			continue
		}
		node := &corev1.Node{}
		if err := guest.Get(ctx, client.ObjectKey{Name: w.Machine}, node); err != nil {
			continue // not registered yet
		}
		if schedulable(&ds.Spec.Template.Spec, node) {
			eligible = append(eligible, w)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	keep := map[string]bool{}
	for _, w := range eligible {
		keep[w.Machine] = true
		p := a.running[w.Machine]
		exited := p != nil && p.p.exited() != nil
		if p == nil || p.worker != w || p.generation != ds.Generation || exited {
			if p != nil {
				p.kill()
			}
			np, err := a.start(ctx, ds, w)
			if err != nil {
				delete(a.running, w.Machine)
				return err
			}
			a.running[w.Machine] = np
			p = np
		}
		p.ready = probeReady(ctx, &ds.Spec.Template.Spec, w)
	}
	for m, p := range a.running {
		if !keep[m] {
			p.kill()
			delete(a.running, m)
		}
	}
	st := appsv1.DaemonSetStatus{DesiredNumberScheduled: int32(len(eligible)), ObservedGeneration: ds.Generation}
	for _, p := range a.running {
		st.CurrentNumberScheduled++
		if p.generation == ds.Generation {
			st.UpdatedNumberScheduled++
			if p.ready {
				st.NumberReady++
				st.NumberAvailable++
			}
		}
	}
	st.NumberUnavailable = st.DesiredNumberScheduled - st.NumberAvailable
	if ds.Status.DesiredNumberScheduled == st.DesiredNumberScheduled && ds.Status.CurrentNumberScheduled == st.CurrentNumberScheduled &&
		ds.Status.UpdatedNumberScheduled == st.UpdatedNumberScheduled && ds.Status.NumberReady == st.NumberReady &&
		ds.Status.NumberAvailable == st.NumberAvailable && ds.Status.NumberUnavailable == st.NumberUnavailable &&
		ds.Status.ObservedGeneration == st.ObservedGeneration {
		return nil
	}
	ds.Status = st
	return client.IgnoreNotFound(guest.Status().Update(ctx, ds))
}

// schedulable: the pod's nodeSelector matches node and its tolerations tolerate node's
// NoSchedule and NoExecute taints.
func schedulable(spec *corev1.PodSpec, node *corev1.Node) bool {
	for k, v := range spec.NodeSelector {
		if node.Labels[k] != v {
			return false
		}
	}
	for i := range node.Spec.Taints {
		t := &node.Spec.Taints[i]
		if t.Effect == corev1.TaintEffectPreferNoSchedule {
			continue
		}
		tolerated := false
		for j := range spec.Tolerations {
			if spec.Tolerations[j].ToleratesTaint(klog.Background(), t, false) {
				tolerated = true
				break
			}
		}
		if !tolerated {
			return false
		}
	}
	return true
}

// start runs the agent container of ds on worker w, as its kubelet would.
func (a *NodeAgents) start(ctx context.Context, ds *appsv1.DaemonSet, w *Worker) (*agentPod, error) {
	spec := &ds.Spec.Template.Spec
	if len(spec.Containers) != 1 || spec.Containers[0].Image != NodeAgentImage || !spec.HostNetwork {
		return nil, fmt.Errorf("DaemonSet %s/%s: the stand-in runs one host-network container of image %s", ds.Namespace, ds.Name, NodeAgentImage)
	}
	c := spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			env[e.Name] = w.Machine
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		}
	}
	kubeconfig, err := a.kubeconfig(ctx, ds, w, env)
	if err != nil {
		return nil, err
	}
	args := make([]string, 0, len(c.Command)+len(c.Args)+1)
	for _, arg := range append(append([]string{}, c.Command...), c.Args...) {
		for k, v := range env {
			arg = strings.ReplaceAll(arg, "$("+k+")", v)
		}
		args = append(args, arg)
	}
	args = append(args, "--kubeconfig="+kubeconfig)
	bin := os.Getenv("GUESTNET_MANAGER_BIN")
	if bin == "" {
		return nil, fmt.Errorf("GUESTNET_MANAGER_BIN is not set: the node agent stand-in runs the manager binary")
	}
	cmd, err := w.InVM(context.WithoutCancel(ctx), bin, args...)
	if err != nil {
		return nil, err
	}
	a.starts++
	p, err := startCommand(a.l.Dir, fmt.Sprintf("node-agent-%s-%d", w.Machine, a.starts), cmd)
	if err != nil {
		return nil, err
	}
	return &agentPod{p: p, worker: w, generation: ds.Generation}, nil
}

// kubeconfig writes the agent's credentials: the server its env names, the guest's CA, a
// token of the pod's ServiceAccount.
func (a *NodeAgents) kubeconfig(ctx context.Context, ds *appsv1.DaemonSet, w *Worker, env map[string]string) (string, error) {
	host, port := env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]
	if host == "" || port == "" {
		return "", fmt.Errorf("DaemonSet %s/%s: no KUBERNETES_SERVICE_HOST/PORT in the container's env: the lab's guest has no kube-proxy for the kubernetes Service", ds.Namespace, ds.Name)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ds.Namespace, Name: ds.Spec.Template.Spec.ServiceAccountName}}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if err := a.l.Guest.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		return "", fmt.Errorf("a token of ServiceAccount %s/%s: %w", sa.Namespace, sa.Name, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["guest"] = &clientcmdapi.Cluster{Server: "https://" + net.JoinHostPort(host, port), CertificateAuthorityData: a.l.Guest.CA.CertPEM()}
	cfg.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["guest"] = &clientcmdapi.Context{Cluster: "guest", AuthInfo: "agent"}
	cfg.CurrentContext = "guest"
	path := filepath.Join(a.l.Dir, "node-agent-"+w.Machine+".kubeconfig")
	return path, clientcmd.WriteToFile(*cfg, path)
}

// probeReady runs the container's readiness probe (httpGet) from the VM's network namespace.
func probeReady(ctx context.Context, spec *corev1.PodSpec, w *Worker) bool {
	probe := spec.Containers[0].ReadinessProbe
	if probe == nil || probe.HTTPGet == nil {
		return true
	}
	host := cmp.Or(probe.HTTPGet.Host, w.IP) // a hostNetwork pod's IP is the node's
	url := "http://" + net.JoinHostPort(host, strconv.Itoa(probe.HTTPGet.Port.IntValue())) + probe.HTTPGet.Path
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{DialContext: w.DialFromVM, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 400
}

// Kill kills the agent process of machine, as a crash or an OOM kill would; the played
// kubelet starts it again.
func (a *NodeAgents) Kill(machine string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.running[machine]
	if p == nil {
		return fmt.Errorf("no node agent runs for %s", machine)
	}
	p.kill()
	return nil
}

// finalizeNamespace plays the guest's namespace controller for the agent's namespace (the
// lab's guest runs no kube-controller-manager): once it is being deleted and holds no agent
// DaemonSet or ServiceAccount, its finalizer goes and the namespace with it.
func (a *NodeAgents) finalizeNamespace(ctx context.Context) error {
	guest := a.l.Guest.Client
	ns := &corev1.Namespace{}
	if err := guest.Get(ctx, client.ObjectKey{Name: nodeagent.Namespace}, ns); err != nil || ns.DeletionTimestamp == nil {
		return client.IgnoreNotFound(err)
	}
	for _, o := range []client.Object{&appsv1.DaemonSet{}, &corev1.ServiceAccount{}} {
		if err := guest.Get(ctx, client.ObjectKey{Namespace: nodeagent.Namespace, Name: nodeagent.Name}, o); !apierrors.IsNotFound(err) {
			return client.IgnoreNotFound(err)
		}
	}
	ns.Spec.Finalizers = nil
	return client.IgnoreNotFound(guest.SubResource("finalize").Update(ctx, ns))
}

// CiliumNodeGVK is Cilium's per-node object in a guest.
var CiliumNodeGVK = schema.GroupVersionKind{Group: "cilium.io", Version: "v2", Kind: "CiliumNode"}

// InstallGuestCiliumNodeCRD installs in the guest a stand-in CRD of Cilium's CiliumNode
// (cluster-scoped, any spec; no Cilium agent runs in the lab's guest), and returns what
// removes it. A test writes CiliumNodes as an agent does: spec.addresses of {type: InternalIP,
// ip} with the node IP the agent read at its start.
func (l *Lab) InstallGuestCiliumNodeCRD() (remove func(), err error) {
	crd := standInCRD(CiliumNodeGVK)
	crd.Labels = map[string]string{"lab.guestnet.dev/stand-in": "true"}
	crd.Spec.Scope = apiextensionsv1.ClusterScoped
	crd.Spec.Versions[0].Subresources = nil
	if _, err := envtest.InstallCRDs(l.Guest.Config, envtest.CRDInstallOptions{
		CRDs: []*apiextensionsv1.CustomResourceDefinition{crd}, MaxTime: time.Minute, PollInterval: 100 * time.Millisecond,
	}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("installing the stand-in CiliumNode CRD in the guest: %w", err)
	}
	return func() { _ = l.Guest.Client.Delete(context.Background(), crd) }, nil
}
