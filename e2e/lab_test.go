package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

// The lab's masquerade stand-in behaves as KubeVirt's masquerade binding: with a ports list on
// the interface only declared ports reach the VM; without one every port does.
func TestLab_MasqueradeStandInForwardsOnlyDeclaredPorts(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)

	declaring, err := l.CreateGuestCluster(ctx, uniqueName("masq"), "guest-1", lab.WorkerTemplateOptions{Ports: []int32{22, 10250, 30080}})
	g.Expect(err).NotTo(HaveOccurred())
	w, err := l.AddWorker(ctx, declaring, "masq-a", "10.244.1.21")
	g.Expect(err).NotTo(HaveOccurred())
	serveName(t, w, 30080)
	serveName(t, w, 30443)

	g.Expect(get(ctx, w.IP, 30080)).To(Equal(w.Machine), "a declared port reaches the VM")
	_, err = get(ctx, w.IP, 30443)
	g.Expect(err).To(HaveOccurred(), "an undeclared port never reaches the VM")

	forwardingAll, err := l.CreateGuestCluster(ctx, uniqueName("masq-all"), "guest-1", lab.WorkerTemplateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	w2, err := l.AddWorker(ctx, forwardingAll, "masq-b", "10.244.1.22")
	g.Expect(err).NotTo(HaveOccurred())
	serveName(t, w2, 30443)
	g.Expect(get(ctx, w2.IP, 30443)).To(Equal(w2.Machine), "without a ports list every port reaches the VM")

	g.Expect(l.RemoveWorker(ctx, forwardingAll, w2)).To(Succeed())
	_, err = get(ctx, w2.IP, 30443)
	g.Expect(err).To(HaveOccurred(), "a removed worker answers nothing")
}

// serveName serves the worker's machine name over HTTP on port inside its VM: a stand-in
// for a guest workload behind a NodePort.
func serveName(t *testing.T, w *lab.Worker, port int32) {
	t.Helper()
	l, err := w.ServeInVM(port)
	if err != nil {
		t.Fatalf("serving in VM %s: %v", w.Machine, err)
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(rw, w.Machine) }),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// get does one HTTP GET of http://host:port/ with a short timeout and returns the body.
func get(ctx context.Context, host string, port int32) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, fmt.Sprint(port))+"/", nil)
	if err != nil {
		return "", err
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}
