package lab

import (
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"time"
)

// KubeletPort is where kubelets serve their API, and metrics-server scrapes them.
const KubeletPort = 10250

// KubeletUsage is what a worker's kubelet stand-in reports: a steady CPU usage (cores, e.g.
// 0.25 for 250m) and memory working set for the node, and the same for the pods it lists.
type KubeletUsage struct {
	CPUCores    float64
	MemoryBytes int64
	Pods        []PodUsage
}

// PodUsage is the usage of one container of a pod on the node.
type PodUsage struct {
	Namespace, Name, Container string
	CPUCores                   float64
	MemoryBytes                int64
	// Started is the container's start time (the kubelet's container_start_time_seconds).
	Started time.Time
}

// ServeKubeletStandIn runs, inside the worker's VM on KubeletPort, a stand-in for the
// kubelet's resource metrics endpoint: HTTPS with a self-signed certificate (as kubelets
// have unless serving certificates are rotated; metrics-server then needs
// --kubelet-insecure-tls), answering GET /metrics/resource with the Prometheus text
// exposition kubelets serve there (node_cpu_usage_seconds_total,
// node_memory_working_set_bytes, container_* for each pod, scrape_error), every sample
// timestamped. The CPU counters grow at exactly usage.CPUCores core-seconds per second, so a
// rate over any two scrapes gives back that usage. It answers only requests that carry a
// bearer token (it does not review the token, a real kubelet would: this is a stand-in) and
// nothing else, and stops with the worker. Reachable from outside the VM at the worker's
// pod IP when the worker declares KubeletPort (the lab's templates and guestnet do).
func (w *Worker) ServeKubeletStandIn(usage KubeletUsage) error {
	ca, err := NewCA("kubelet-" + w.Machine)
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := ca.Issue(CertRequest{
		CommonName: w.Machine, DNSNames: []string{w.Machine}, IPs: []net.IP{net.ParseIP(w.IP), net.ParseIP(w.VMAddress)}, Server: true,
	})
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return err
	}
	l, err := w.ServeInVM(KubeletPort)
	if err != nil {
		return fmt.Errorf("kubelet stand-in on %s: %w", w.Machine, err)
	}
	started := time.Now()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics/resource", func(rw http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
			http.Error(rw, "Unauthorized", http.StatusUnauthorized)
			return
		}
		rw.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = rw.Write([]byte(usage.exposition(started, time.Now())))
	})
	// Connections that only check the port (Lab.DialKubelet) end before a TLS handshake: not
	// worth a log line each.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	go func() {
		_ = srv.Serve(tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
	}()
	return nil
}

// exposition renders the kubelet's /metrics/resource at time now for a node up since started.
func (u KubeletUsage) exposition(started, now time.Time) string {
	ts := now.UnixMilli()
	// Counters computed from the timestamp they carry, so rates are exact.
	elapsed := float64(ts-started.UnixMilli()) / 1000
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds")
	p("# TYPE container_cpu_usage_seconds_total counter")
	for _, pod := range u.Pods {
		p(`container_cpu_usage_seconds_total{container=%q,namespace=%q,pod=%q} %g %d`, pod.Container, pod.Namespace, pod.Name, 1+pod.CPUCores*elapsed, ts)
	}
	p("# HELP container_memory_working_set_bytes [STABLE] Current working set of the container in bytes")
	p("# TYPE container_memory_working_set_bytes gauge")
	for _, pod := range u.Pods {
		p(`container_memory_working_set_bytes{container=%q,namespace=%q,pod=%q} %d %d`, pod.Container, pod.Namespace, pod.Name, pod.MemoryBytes, ts)
	}
	p("# HELP container_start_time_seconds [STABLE] Start time of the container since unix epoch in seconds")
	p("# TYPE container_start_time_seconds gauge")
	for _, pod := range u.Pods {
		startedAt := pod.Started
		if startedAt.IsZero() {
			startedAt = started
		}
		p(`container_start_time_seconds{container=%q,namespace=%q,pod=%q} %d %d`, pod.Container, pod.Namespace, pod.Name, startedAt.Unix(), startedAt.UnixMilli())
	}
	p("# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds")
	p("# TYPE node_cpu_usage_seconds_total counter")
	p("node_cpu_usage_seconds_total %g %d", 100+u.CPUCores*elapsed, ts)
	p("# HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes")
	p("# TYPE node_memory_working_set_bytes gauge")
	p("node_memory_working_set_bytes %d %d", u.MemoryBytes, ts)
	p("# HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise")
	p("# TYPE scrape_error gauge")
	p("scrape_error 0")
	return b.String()
}
