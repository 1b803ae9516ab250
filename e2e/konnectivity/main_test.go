// Package konnectivity runs the GuestWebhookBridge's mode Auto against the lab's guest flavour
// with the real konnectivity (lab.Options.Konnectivity): the guest apiserver sends its
// `cluster` egress through a konnectivity server over a unix socket, and real agents in the
// worker VMs carry it into the guest, as k0smotron, Kamaji and HyperShift run it. It has a lab
// of its own: the other end-to-end tests keep the guest without konnectivity.
package konnectivity

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	utilrand "k8s.io/apimachinery/pkg/util/rand"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

var shared = lab.Shared{DirPrefix: "guestnet-e2e-konnectivity", Options: lab.Options{Konnectivity: true}}

func TestMain(m *testing.M) { shared.Main(m) }

// setup is the package's guest cluster: two workers, each running a konnectivity agent and a
// kubelet stand-in; cert-manager's webhook on worker 0, metrics-server on worker 1.
type setup struct {
	Cluster       *lab.GuestCluster
	Workers       []*lab.Worker
	Agents        []*lab.KonnectivityAgent
	CertManager   *lab.CertManager
	MetricsServer *lab.MetricsServer
}

var (
	setupOnce sync.Once
	theSetup  *setup
	setupErr  error
)

// The default GuestWebhookBridge nodePort range, declared on the workers as in a worker
// template already rolled for the bridge.
const (
	bridgeNodePortFirst int32 = 30064
	bridgeNodePortCount int32 = 16
)

func start(t *testing.T) (*lab.Lab, *setup) {
	t.Helper()
	l := shared.Get(t)
	setupOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		theSetup, setupErr = setUp(ctx, l)
	})
	if setupErr != nil {
		t.Fatalf("setting up the guest: %v", setupErr)
	}
	return l, theSetup
}

func setUp(ctx context.Context, l *lab.Lab) (*setup, error) {
	ports := []int32{22, lab.KubeletPort, lab.MetricsServerPort, lab.CertManagerWebhookPort}
	for p := bridgeNodePortFirst; p < bridgeNodePortFirst+bridgeNodePortCount; p++ {
		ports = append(ports, p)
	}
	ns := uniqueName("konnectivity")
	gc, err := l.CreateGuestCluster(ctx, ns, "guest-1", lab.WorkerTemplateOptions{Ports: ports})
	if err != nil {
		return nil, err
	}
	s := &setup{Cluster: gc}
	for i, ip := range []string{"10.244.1.241", "10.244.1.242"} {
		w, err := l.AddWorker(ctx, gc, fmt.Sprintf("%s-md-0-%c", ns, 'a'+i), ip)
		if err != nil {
			return nil, err
		}
		if err := w.ServeKubeletStandIn(lab.KubeletUsage{CPUCores: 0.25, MemoryBytes: 1 << 30}); err != nil {
			return nil, err
		}
		s.Workers = append(s.Workers, w)
	}
	if err := l.SetMachineDeploymentStatus(ctx, gc, 2, 2); err != nil {
		return nil, err
	}
	for _, w := range s.Workers {
		a, err := l.StartKonnectivityAgent(ctx, w)
		if err != nil {
			return nil, err
		}
		s.Agents = append(s.Agents, a)
	}
	if s.CertManager, err = l.InstallCertManager(ctx, s.Workers[0]); err != nil {
		return nil, err
	}
	if s.MetricsServer, err = l.InstallMetricsServer(ctx, s.Workers[1]); err != nil {
		return nil, err
	}
	return s, nil
}

func uniqueName(prefix string) string { return prefix + "-" + utilrand.String(5) }
