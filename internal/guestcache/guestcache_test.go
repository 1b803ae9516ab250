package guestcache

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/secret"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/guestbounds"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/kubeconfig"
	guestnetscheme "github.com/guestnet/cluster-api-addon-provider-guestnet/internal/scheme"
)

// These tests drive the Cache's Reconcile by hand, as its controller would for one Cluster,
// against a guest apiserver played by fakeAPIServer (a TLS server on 127.0.0.1), with the
// Cluster and its kubeconfig Secret in a fake host client. The health probe interval is 0
// (every Reconcile of a connected guest probes it), so that the tests count probes, never
// time; the server counts them.

// TestUnauthorizedProbeDisconnectsAtOnceAndReconnects: a guest apiserver that stops
// accepting the credentials (a rotated kubeconfig) answers the probe 401; one such answer
// drops the connection, and the next Reconcile connects with the Secret's new credentials.
func TestUnauthorizedProbeDisconnectsAtOnceAndReconnects(t *testing.T) {
	g := NewWithT(t)
	h := newHarness(t, nil)

	h.reconcile()
	g.Expect(h.connected()).To(BeTrue())
	g.Expect(h.api.probes.Load()).To(BeEquivalentTo(1), "connecting probes GET / once")

	h.api.setToken("rotated")
	h.writeSecret(h.kubeconfig("rotated"))

	res := h.reconcile()
	g.Expect(h.api.probes.Load()).To(BeEquivalentTo(2))
	g.Expect(h.api.unauthorized.Load()).To(BeEquivalentTo(1))
	g.Expect(h.connected()).To(BeFalse(), "one 401 to the probe drops the connection, with a failure threshold of %d", h.cache.healthProbe.FailureThreshold)
	g.Expect(h.logs.messages()).To(ContainElement("Disconnected: the guest apiserver no longer accepts the credentials"))
	g.Expect(res.RequeueAfter).To(BeNumerically(">", 0))
	g.Expect(res.RequeueAfter).To(BeNumerically("<", h.cache.connectRetryInterval()), "it connects again at once, not after the retry interval")

	h.reconcile()
	g.Expect(h.connected()).To(BeTrue(), "the next Reconcile connects with the rotated kubeconfig")
	g.Expect(h.api.probes.Load()).To(BeEquivalentTo(3))
	cfg, err := h.cache.GetRESTConfig(h.ctx, h.key)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg.BearerToken).To(Equal("rotated"))
}

// TestFailedProbesDisconnectAfterFiveInARow: probes that fail otherwise than 401 (an error
// status, or no answer within the probe timeout) drop the connection on the 5th failure in
// a row; a success in between starts the count again. The failure threshold is the
// production one.
func TestFailedProbesDisconnectAfterFiveInARow(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answer  probeAnswer
		timeout time.Duration
	}{
		{"internal error", answerInternalError, time.Minute},
		{"no answer within the probe timeout", answerHang, 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			h := newHarness(t, nil)
			h.reconcile()
			g.Expect(h.connected()).To(BeTrue())
			threshold := h.cache.healthProbe.FailureThreshold
			g.Expect(threshold).To(Equal(5), "CAPI's threshold")

			// failUntilJustBelow probes threshold-1 times, each failing, and checks the
			// connection survives them.
			failUntilJustBelow := func() {
				h.api.setProbeAnswer(tc.answer)
				h.cache.healthProbe.Timeout = tc.timeout
				for i := 1; i < threshold; i++ {
					before := h.api.probes.Load()
					res := h.reconcile()
					g.Expect(h.api.probes.Load()).To(Equal(before+1), "one probe per Reconcile")
					g.Expect(h.connected()).To(BeTrue(), "still connected after %d failed probes", i)
					g.Expect(h.state().ConsecutiveFailures).To(Equal(i))
					g.Expect(res.RequeueAfter).To(Equal(h.cache.healthProbe.Interval))
				}
			}

			failUntilJustBelow()
			h.api.setProbeAnswer(answerOK)
			h.cache.healthProbe.Timeout = time.Minute
			h.reconcile()
			g.Expect(h.connected()).To(BeTrue())
			g.Expect(h.state().ConsecutiveFailures).To(BeZero(), "a probe that succeeds starts the count again")

			failUntilJustBelow()
			before := h.api.probes.Load()
			res := h.reconcile()
			g.Expect(h.api.probes.Load()).To(Equal(before + 1))
			g.Expect(h.connected()).To(BeFalse(), "the %dth failure in a row drops the connection", threshold)
			g.Expect(h.logs.messages()).To(ContainElement("Disconnected: the guest apiserver did not answer the health probe"))
			g.Expect(res.RequeueAfter).To(Equal(h.cache.connectRetryInterval()), "it connects again after the retry interval")
			g.Expect(h.api.unauthorized.Load()).To(BeZero())

			// Another event of the Cluster (a status update) before the retry interval does
			// not connect again: a guest that stopped answering is not dialled on every event.
			before = h.api.probes.Load()
			res = h.reconcile()
			g.Expect(h.connected()).To(BeFalse(), "no connect before the retry interval has passed")
			g.Expect(h.api.probes.Load()).To(Equal(before), "no try to connect")
			g.Expect(res.RequeueAfter).To(BeNumerically(">", 0))
			g.Expect(res.RequeueAfter).To(BeNumerically("<=", h.cache.connectRetryInterval()))
		})
	}
}

// TestFailedConnectIsRetriedAfterTheRetryInterval: a connect that fails (here: no kubeconfig
// Secret yet) is logged and not tried again before the retry interval has passed.
func TestFailedConnectIsRetriedAfterTheRetryInterval(t *testing.T) {
	g := NewWithT(t)
	h := newHarness(t, nil)
	g.Expect(h.host.Delete(h.ctx, h.secret())).To(Succeed())
	h.cache.SetConnectionCreationRetryInterval(time.Hour)

	res := h.reconcile()
	g.Expect(res.RequeueAfter).To(Equal(time.Hour))
	g.Expect(h.connected()).To(BeFalse())
	_, err := h.cache.GetClient(h.ctx, h.key)
	g.Expect(err).To(MatchError(clustercache.ErrClusterNotConnected))
	failed := h.logs.errors("Connect failed")
	g.Expect(failed).To(HaveLen(1))
	g.Expect(apierrors.IsNotFound(failed[0])).To(BeTrue(), "the Secret's NotFound: %v", failed[0])
	g.Expect(failed[0].Error()).To(ContainSubstring("reading the kubeconfig Secret"))
	g.Expect(h.state().ConsecutiveFailures).To(BeEquivalentTo(1))
	g.Expect(h.state().LastProbeSuccessTime.IsZero()).To(BeTrue())

	// The Secret appears (its creation is no event for this controller: it watches Clusters),
	// and a Cluster update brings the Cluster back before the retry interval has passed.
	h.writeSecret(h.kubeconfig(h.api.token()))
	res = h.reconcile()
	g.Expect(h.connected()).To(BeFalse(), "no connect before the retry interval has passed")
	g.Expect(res.RequeueAfter).To(BeNumerically("~", time.Hour, time.Minute))
	g.Expect(h.logs.errors("Connect failed")).To(HaveLen(1), "no second try")

	h.cache.SetConnectionCreationRetryInterval(10 * time.Millisecond)
	g.Eventually(func() bool {
		h.reconcile()
		return h.connected()
	}, 30*time.Second, 5*time.Millisecond).Should(BeTrue(), "connected once the retry interval has passed")
	g.Expect(h.api.probes.Load()).To(BeEquivalentTo(1), "no probe reached the guest before the Secret existed")
	g.Expect(h.logs.errors("Connect failed")).To(HaveLen(1))
	g.Expect(h.state().ConsecutiveFailures).To(BeZero(), "connecting resets the health state")
}

// TestConnectFailures: what each failed connect logs, and that a refused kubeconfig is never
// dialed.
func TestConnectFailures(t *testing.T) {
	for _, tc := range []struct {
		name string
		// secrets wraps the host client as the Cache's SecretClient, when set.
		secrets func(client.Reader) client.Reader
		// kubeconfig is the Secret's kubeconfig, made from the server's.
		kubeconfig func(*clientcmdapi.Config)
		// check checks the error "Connect failed" logged.
		check   func(g Gomega, err error)
		dialled bool
	}{{
		name: "refused by guestnet's check (kubeconfig.SecretReader)",
		secrets: func(r client.Reader) client.Reader {
			return kubeconfig.SecretReader{Reader: r}
		},
		kubeconfig: func(*clientcmdapi.Config) {},
		check: func(g Gomega, err error) {
			refused, ok := kubeconfig.AsRefused(err)
			g.Expect(ok).To(BeTrue(), "a *kubeconfig.RefusedError: %v", err)
			g.Expect(refused.Source).To(Equal("Secret guests/guest-kubeconfig"))
			// The test's guest is on 127.0.0.1, an endpoint guestnet refuses.
			g.Expect(err.Error()).To(ContainSubstring("Cluster spec.controlPlaneEndpoint.host"))
		},
	}, {
		name: "an exec plugin, refused by guestcache itself",
		kubeconfig: func(cfg *clientcmdapi.Config) {
			cfg.AuthInfos["guest"].Exec = &clientcmdapi.ExecConfig{
				Command: "must-never-run", APIVersion: "client.authentication.k8s.io/v1", InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
			}
		},
		check: func(g Gomega, err error) {
			g.Expect(err.Error()).To(ContainSubstring("exec plugin"))
		},
	}, {
		name: "a kubeconfig that is not one",
		kubeconfig: func(cfg *clientcmdapi.Config) {
			cfg.CurrentContext = "none"
		},
		check: func(g Gomega, err error) {
			g.Expect(err.Error()).To(ContainSubstring("parsing the kubeconfig"))
		},
	}, {
		name: "credentials the guest does not accept",
		kubeconfig: func(cfg *clientcmdapi.Config) {
			cfg.AuthInfos["guest"].Token = "wrong"
		},
		check: func(g Gomega, err error) {
			g.Expect(apierrors.IsUnauthorized(err)).To(BeTrue(), "the probe's 401: %v", err)
			g.Expect(err.Error()).To(ContainSubstring("the guest apiserver does not answer"))
		},
		dialled: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			h := newHarness(t, tc.secrets)
			cfg := h.kubeconfig(h.api.token())
			tc.kubeconfig(cfg)
			h.writeSecret(cfg)

			res := h.reconcile()
			g.Expect(h.connected()).To(BeFalse())
			g.Expect(res.RequeueAfter).To(Equal(h.cache.connectRetryInterval()))
			failed := h.logs.errors("Connect failed")
			g.Expect(failed).To(HaveLen(1))
			tc.check(g, failed[0])
			if tc.dialled {
				g.Expect(h.api.probes.Load()).To(BeEquivalentTo(1))
				g.Expect(h.api.unauthorized.Load()).To(BeEquivalentTo(1))
			} else {
				g.Expect(h.api.requests.Load()).To(BeZero(), "a refused kubeconfig is never dialed")
			}
		})
	}
}

// TestConnectAndDisconnectAreEventsAndWatchesEndWithTheConnection: every GetClusterSource
// gets an event when the guest connects, when the probe drops it and when its Cluster is
// deleted; the watches added to a connection end with it, and the next connection starts
// without any.
func TestConnectAndDisconnectAreEventsAndWatchesEndWithTheConnection(t *testing.T) {
	g := NewWithT(t)
	h := newHarness(t, nil)
	first, second := h.startClusterSource("first"), h.startClusterSource("second")
	watcher := h.watcher("services")

	h.reconcile()
	g.Expect(h.connected()).To(BeTrue())
	g.Eventually(first.count).Should(Equal(1), "connect event")
	g.Eventually(second.count).Should(Equal(1), "connect event")

	g.Expect(h.cache.Watch(h.ctx, h.key, watcher)).To(Succeed())
	g.Eventually(h.api.openWatches.Load, 30*time.Second).Should(BeEquivalentTo(1), "the watch of Services is open")
	g.Expect(h.cache.Watch(h.ctx, h.key, watcher)).To(Succeed())
	g.Expect(watcher.started.Load()).To(BeEquivalentTo(1), "a watch is added once per connection")

	h.api.setToken("rotated")
	h.reconcile()
	g.Expect(h.connected()).To(BeFalse())
	g.Eventually(first.count).Should(Equal(2), "disconnect event")
	g.Eventually(second.count).Should(Equal(2), "disconnect event")
	g.Eventually(h.api.openWatches.Load, 30*time.Second).Should(BeZero(), "the watch ends with the connection")
	g.Expect(h.cache.Watch(h.ctx, h.key, watcher)).To(MatchError(clustercache.ErrClusterNotConnected))

	h.writeSecret(h.kubeconfig("rotated"))
	h.reconcile()
	g.Expect(h.connected()).To(BeTrue())
	g.Eventually(first.count).Should(Equal(3), "reconnect event")
	g.Eventually(second.count).Should(Equal(3), "reconnect event")
	g.Expect(h.cache.Watch(h.ctx, h.key, watcher)).To(Succeed())
	g.Expect(watcher.started.Load()).To(BeEquivalentTo(2), "the new connection has no watch until it is added again")
	g.Eventually(h.api.openWatches.Load, 30*time.Second).Should(BeEquivalentTo(1))

	g.Expect(h.host.Delete(h.ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.key.Namespace, Name: h.key.Name}})).To(Succeed())
	h.reconcile()
	g.Expect(h.connected()).To(BeFalse())
	g.Eventually(first.count).Should(Equal(4), "the Cluster is gone")
	g.Eventually(second.count).Should(Equal(4), "the Cluster is gone")
	g.Eventually(h.api.openWatches.Load, 30*time.Second).Should(BeZero())
	g.Expect(h.cache.GetHealthCheckingState(h.ctx, h.key)).To(BeZero(), "a Cluster that is gone is forgotten")
	for _, s := range []*clusterSource{first, second} {
		g.Expect(s.clusters()).To(HaveEach(h.key), "every event names the Cluster")
	}
	g.Expect(h.api.watchesStarted.Load()).To(BeEquivalentTo(2), "one watch per connection, none after")
}

// harness is one Cluster, "guests/guest", whose guest apiserver is api.
type harness struct {
	t     *testing.T
	ctx   context.Context
	api   *fakeAPIServer
	host  client.Client
	cache *Cache
	key   client.ObjectKey
	logs  *logRecorder
}

// newHarness starts the guest apiserver and a Cache whose SecretClient is the host client,
// wrapped by secrets when not nil, with a provisioned Cluster and its kubeconfig Secret.
func newHarness(t *testing.T, secrets func(client.Reader) client.Reader) *harness {
	t.Helper()
	h := &harness{t: t, api: startFakeAPIServer(t), key: client.ObjectKey{Namespace: "guests", Name: "guest"}, logs: &logRecorder{}}
	ctx, cancel := context.WithCancel(context.Background())
	h.ctx = ctrl.LoggerInto(ctx, logr.New(&recordingSink{rec: h.logs}))
	t.Cleanup(cancel)

	scheme := guestnetscheme.New()
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.key.Namespace, Name: h.key.Name}}
	cluster.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: "127.0.0.1", Port: int32(h.api.port())}
	cluster.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
	h.host = fake.NewClientBuilder().WithScheme(scheme).WithObjects(cluster).Build()
	h.writeSecret(h.kubeconfig(h.api.token()))

	var secretClient client.Reader = h.host
	if secrets != nil {
		secretClient = secrets(h.host)
	}
	h.cache = newCache(h.host, scheme, Options{SecretClient: secretClient, UserAgent: "guestcache-test"})
	h.cache.healthProbe.Interval = 0
	// Generous: an answer must never be late on a loaded machine. Only probes meant to go
	// unanswered get a short timeout.
	h.cache.healthProbe.Timeout = time.Minute
	t.Cleanup(h.cache.Shutdown)
	t.Cleanup(func() {
		if t.Failed() {
			for _, e := range h.logs.all() {
				t.Logf("log: %s %v %v", e.msg, e.err, e.keysAndValues)
			}
		}
	})
	return h
}

func (h *harness) reconcile() reconcile.Result {
	h.t.Helper()
	res, err := h.cache.Reconcile(h.ctx, reconcile.Request{NamespacedName: h.key})
	if err != nil {
		h.t.Fatalf("Reconcile: %v", err)
	}
	return res
}

func (h *harness) connected() bool {
	_, err := h.cache.GetClient(h.ctx, h.key)
	return err == nil
}

func (h *harness) state() clustercache.HealthCheckingState {
	return h.cache.GetHealthCheckingState(h.ctx, h.key)
}

func (h *harness) secret() *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: h.key.Namespace, Name: secret.Name(h.key.Name, secret.Kubeconfig)}}
}

// kubeconfig returns a kubeconfig of the guest apiserver that authenticates with token.
func (h *harness) kubeconfig(token string) *clientcmdapi.Config {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["guest"] = &clientcmdapi.Cluster{Server: h.api.srv.URL, CertificateAuthorityData: h.api.caPEM()}
	cfg.AuthInfos["guest"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["guest"] = &clientcmdapi.Context{Cluster: "guest", AuthInfo: "guest"}
	cfg.CurrentContext = "guest"
	return cfg
}

// writeSecret creates or updates the Cluster's kubeconfig Secret.
func (h *harness) writeSecret(cfg *clientcmdapi.Config) {
	h.t.Helper()
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	s := h.secret()
	_, err = ctrl.CreateOrUpdate(h.ctx, h.host, s, func() error {
		s.Data = map[string][]byte{secret.KubeconfigDataName: data}
		return nil
	})
	if err != nil {
		h.t.Fatal(err)
	}
}

// clusterSource is a started GetClusterSource: the Clusters of the events it got.
type clusterSource struct {
	mu   sync.Mutex
	keys []client.ObjectKey
}

func (s *clusterSource) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

func (s *clusterSource) clusters() []client.ObjectKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.keys)
}

// startClusterSource starts a GetClusterSource as a controller would.
func (h *harness) startClusterSource(name string) *clusterSource {
	s := &clusterSource{}
	src := h.cache.GetClusterSource(name, func(_ context.Context, cluster client.Object) []reconcile.Request {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.keys = append(s.keys, client.ObjectKeyFromObject(cluster))
		return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(cluster)}}
	})
	queue := newQueue(h.t)
	if err := src.Start(h.ctx, queue); err != nil {
		h.t.Fatal(err)
	}
	return s
}

// countingSourceWatcher starts each source it is given, as a controller's Watch does.
type countingSourceWatcher struct {
	ctx     context.Context
	queue   workqueue.TypedRateLimitingInterface[reconcile.Request]
	started atomic.Int32
}

func (w *countingSourceWatcher) Watch(src source.TypedSource[reconcile.Request]) error {
	w.started.Add(1)
	return src.Start(w.ctx, w.queue)
}

// testWatcher is a clustercache.Watcher and how often it was started.
type testWatcher struct {
	clustercache.Watcher
	started *atomic.Int32
}

// watcher returns a watch of the guest's Services, made as guestnet's controllers make theirs.
func (h *harness) watcher(name string) testWatcher {
	sw := &countingSourceWatcher{ctx: h.ctx, queue: newQueue(h.t)}
	return testWatcher{
		Watcher: clustercache.NewWatcher(clustercache.WatcherOptions{
			Name: name, Watcher: sw, Kind: &corev1.Service{},
			EventHandler: &handler.EnqueueRequestForObject{},
		}),
		started: &sw.started,
	}
}

func newQueue(t *testing.T) workqueue.TypedRateLimitingInterface[reconcile.Request] {
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	t.Cleanup(q.ShutDown)
	return q
}

// logRecorder keeps what the Cache logs.
type logRecorder struct {
	mu      sync.Mutex
	entries []logEntry
}

type logEntry struct {
	msg           string
	err           error
	keysAndValues []any
}

func (r *logRecorder) all() []logEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.entries)
}

func (r *logRecorder) messages() []string {
	var msgs []string
	for _, e := range r.all() {
		msgs = append(msgs, e.msg)
	}
	return msgs
}

// errors returns the errors logged with msg.
func (r *logRecorder) errors(msg string) []error {
	var errs []error
	for _, e := range r.all() {
		if e.msg == msg && e.err != nil {
			errs = append(errs, e.err)
		}
	}
	return errs
}

// recordingSink is a logr.LogSink into a logRecorder, of what guestcache logs (up to V(4)):
// not client-go's request and response bodies.
type recordingSink struct{ rec *logRecorder }

func (s *recordingSink) Init(logr.RuntimeInfo)                  {}
func (s *recordingSink) Enabled(level int) bool                 { return level <= 4 }
func (s *recordingSink) WithValues(...any) logr.LogSink         { return s }
func (s *recordingSink) WithName(string) logr.LogSink           { return s }
func (s *recordingSink) Info(_ int, msg string, kv ...any)      { s.add(msg, nil, kv) }
func (s *recordingSink) Error(err error, msg string, kv ...any) { s.add(msg, err, kv) }

func (s *recordingSink) add(msg string, err error, kv []any) {
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	s.rec.entries = append(s.rec.entries, logEntry{msg: msg, err: err, keysAndValues: kv})
}

// probeAnswer is how the fake guest apiserver answers GET / to an authenticated client.
type probeAnswer int

const (
	answerOK probeAnswer = iota
	// answerInternalError is a 500 with the Status a kube-apiserver writes for an internal error.
	answerInternalError
	// answerHang answers nothing until the client gives up.
	answerHang
)

// fakeAPIServer plays what the guest connections ask of a kube-apiserver, as a real one
// answers it (JSON): GET / (the health probe), and the list and watch of Services. Every
// request must carry the bearer token it accepts, else it is answered 401 with the Status a
// kube-apiserver writes when no authenticator accepts the request.
type fakeAPIServer struct {
	srv *httptest.Server
	// closing ends the watches and hung probes when the test ends.
	closing chan struct{}

	mu             sync.Mutex
	acceptedToken  string
	rootAnswer     probeAnswer
	unexpectedURLs []string

	requests, probes, unauthorized atomic.Int32
	watchesStarted, openWatches    atomic.Int32
	// countLists are the lists of Services with limit=1 (guestbounds' count); services is
	// how many Services such a list says there are (the informers' lists get none).
	countLists, services atomic.Int32
}

// servicesResourceVersion is the resource version of the guest's (empty) Service list.
const servicesResourceVersion = "100"

func startFakeAPIServer(t *testing.T) *fakeAPIServer {
	t.Helper()
	s := &fakeAPIServer{acceptedToken: "initial", closing: make(chan struct{})}
	s.srv = httptest.NewUnstartedServer(s)
	// httptest listens on loopback already; bind 127.0.0.1 explicitly all the same.
	_ = s.srv.Listener.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.srv.Listener = l
	s.srv.EnableHTTP2 = true // as a kube-apiserver: one HTTP/2 connection per guest
	s.srv.StartTLS()
	t.Cleanup(func() {
		close(s.closing)
		s.srv.CloseClientConnections()
		s.srv.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.unexpectedURLs) > 0 {
			t.Errorf("the guest apiserver was asked what the guest connections should not ask: %v", s.unexpectedURLs)
		}
	})
	return s
}

func (s *fakeAPIServer) port() int { return s.srv.Listener.Addr().(*net.TCPAddr).Port }

// caPEM is the server's own (self-signed) certificate, the one CA the kubeconfig trusts.
func (s *fakeAPIServer) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.srv.Certificate().Raw})
}

func (s *fakeAPIServer) token() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acceptedToken
}

// setToken makes the server accept token only.
func (s *fakeAPIServer) setToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.acceptedToken = token
}

func (s *fakeAPIServer) setProbeAnswer(a probeAnswer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rootAnswer = a
}

func (s *fakeAPIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	s.mu.Lock()
	token, rootAnswer := s.acceptedToken, s.rootAnswer
	s.mu.Unlock()
	isProbe := r.Method == http.MethodGet && r.URL.Path == "/"
	if isProbe {
		s.probes.Add(1)
	}
	if r.Header.Get("Authorization") != "Bearer "+token {
		s.unauthorized.Add(1)
		// {"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}
		writeStatus(w, apierrors.NewUnauthorized("Unauthorized"))
		return
	}
	switch {
	case isProbe:
		s.serveRoot(w, r, rootAnswer)
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/services" && r.URL.Query().Get("watch") == "true":
		s.serveWatch(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/services" && r.URL.Query().Get("limit") == "1":
		s.countLists.Add(1)
		list := &metav1.PartialObjectMetadataList{
			TypeMeta: metav1.TypeMeta{Kind: "PartialObjectMetadataList", APIVersion: "meta.k8s.io/v1"},
			ListMeta: metav1.ListMeta{ResourceVersion: servicesResourceVersion},
		}
		if n := int64(s.services.Load()); n > 0 {
			list.Items = []metav1.PartialObjectMetadata{{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "svc-0"}}}
			if n > 1 {
				list.Continue, list.RemainingItemCount = "next", ptr.To(n-1)
			}
		}
		writeJSON(w, http.StatusOK, list)
	case r.Method == http.MethodGet && r.URL.Query().Get("limit") == "1" && countedKind(r.URL.Path):
		// The other kinds guestbounds counts: none.
		s.countLists.Add(1)
		writeJSON(w, http.StatusOK, &metav1.PartialObjectMetadataList{
			TypeMeta: metav1.TypeMeta{Kind: "PartialObjectMetadataList", APIVersion: "meta.k8s.io/v1"},
		})
	case r.Method == http.MethodGet && r.URL.Path == "/api/v1/services":
		writeJSON(w, http.StatusOK, &corev1.ServiceList{
			TypeMeta: metav1.TypeMeta{Kind: "ServiceList", APIVersion: "v1"},
			ListMeta: metav1.ListMeta{ResourceVersion: servicesResourceVersion},
			Items:    []corev1.Service{},
		})
	default:
		s.mu.Lock()
		s.unexpectedURLs = append(s.unexpectedURLs, r.Method+" "+r.URL.String())
		s.mu.Unlock()
		writeStatus(w, apierrors.NewNotFound(corev1.Resource(""), ""))
	}
}

// serveRoot answers the health probe: the paths the server serves, an internal error, or
// nothing until the client gives up.
func (s *fakeAPIServer) serveRoot(w http.ResponseWriter, r *http.Request, answer probeAnswer) {
	switch answer {
	case answerInternalError:
		writeStatus(w, apierrors.NewInternalError(errors.New("the guest apiserver is unwell")))
	case answerHang:
		select {
		case <-r.Context().Done():
		case <-s.closing:
		}
	default:
		writeJSON(w, http.StatusOK, &metav1.RootPaths{Paths: []string{"/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"}})
	}
}

// serveWatch holds a watch of Services open until the client ends it. A watch that asks for
// the initial events (client-go's WatchListClient) first gets them, none here, and the
// bookmark that ends them.
func (s *fakeAPIServer) serveWatch(w http.ResponseWriter, r *http.Request) {
	s.watchesStarted.Add(1)
	s.openWatches.Add(1)
	defer s.openWatches.Add(-1)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if r.URL.Query().Get("sendInitialEvents") == "true" {
		bookmark := &corev1.Service{
			TypeMeta: metav1.TypeMeta{Kind: "Service", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{
				ResourceVersion: servicesResourceVersion,
				Annotations:     map[string]string{metav1.InitialEventsAnnotationKey: "true"},
			},
		}
		raw, _ := json.Marshal(bookmark)
		_ = json.NewEncoder(w).Encode(&metav1.WatchEvent{Type: "BOOKMARK", Object: runtime.RawExtension{Raw: raw}})
	}
	w.(http.Flusher).Flush()
	select {
	case <-r.Context().Done():
	case <-s.closing:
	}
}

func writeStatus(w http.ResponseWriter, err apierrors.APIStatus) {
	status := err.Status()
	status.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	writeJSON(w, int(status.Code), &status)
}

func writeJSON(w http.ResponseWriter, code int, body any) {
	data, err := json.Marshal(body)
	if err != nil {
		panic(fmt.Sprintf("encoding %T: %v", body, err))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(data)
}

// Before its first try the cache has not tried (a manager that just started knows nothing of
// the guest: clusterscope.NotTriedYet); the first failed try is an event, so that the objects
// that waited for it report the guest unreachable; the next failures are not.
func TestTheFirstFailedTryIsAnEvent(t *testing.T) {
	g := NewWithT(t)
	h := newHarness(t, nil)
	source := h.startClusterSource("objects")
	g.Expect(h.host.Delete(h.ctx, h.secret())).To(Succeed())
	h.cache.SetConnectionCreationRetryInterval(time.Millisecond)
	g.Expect(h.cache.Tried(h.ctx, h.key)).To(BeFalse())

	h.reconcile()
	g.Expect(h.cache.Tried(h.ctx, h.key)).To(BeTrue())
	g.Eventually(source.count).Should(Equal(1), "the first failure is an event")

	time.Sleep(5 * time.Millisecond) // past the retry interval
	h.reconcile()
	g.Expect(h.logs.errors("Connect failed")).To(HaveLen(2))
	g.Consistently(source.count, 200*time.Millisecond).Should(Equal(1), "the second is not")
}

// countedKind reports whether path lists one of the kinds guestbounds counts.
func countedKind(path string) bool {
	for _, gvk := range guestbounds.Kinds {
		if strings.HasPrefix(path, "/apis/"+gvk.Group+"/") && strings.HasSuffix(path, "/"+strings.ToLower(gvk.Kind)+"s") {
			return true
		}
	}
	return false
}

// noRequests is a reader that fails the test when it is asked anything.
type noRequests struct {
	client.Reader
	t *testing.T
}

func (r noRequests) List(context.Context, client.ObjectList, ...client.ListOption) error {
	r.t.Error("a live count after the connect counted")
	return nil
}

// The connect counts the guest's capped kinds, all at once: the first reconcile of each object
// of the guest finds the count made, and the first informer of a capped kind starts without
// counting again.
func TestConnectCountsTheGuest(t *testing.T) {
	g := NewWithT(t)
	h := newHarness(t, nil)
	h.cache.opts.Bounds = &guestbounds.Bounds{}
	h.reconcile()
	g.Expect(h.connected()).To(BeTrue())
	g.Expect(h.api.countLists.Load()).To(BeEquivalentTo(len(guestbounds.Kinds)))

	g.Expect(h.cache.opts.Bounds.Check(h.ctx, h.key, noRequests{t: t}, nil)).To(Succeed())
	g.Expect(h.cache.opts.Bounds.CheckKind(h.ctx, h.key, noRequests{t: t}, corev1.SchemeGroupVersion.WithKind("Service"))).To(Succeed())
}

// A manager that stops while a guest connects: the controllers' sources no longer read, and
// the connect's event must not hold the cache's worker. It did, until the manager's grace
// period ran out and the manager stopped with an error (a lab test failed so in CI).
func TestAnEventNobodyReadsDoesNotHoldAStoppingManager(t *testing.T) {
	g := NewWithT(t)
	h := newHarness(t, nil)
	// Registered, never started: nobody reads it, as after the manager stopped its sources.
	h.cache.GetClusterSource("stopped", func(context.Context, client.Object) []reconcile.Request { return nil })
	ctx, stop := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = h.cache.Reconcile(ctx, reconcile.Request{NamespacedName: h.key})
	}()

	stop() // the manager stops, during the connect or after it
	g.Eventually(done).WithTimeout(30*time.Second).Should(BeClosed(), "the Reconcile returns once its context is done")
}
