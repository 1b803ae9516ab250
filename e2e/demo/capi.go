package main

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

// capiWatchFilter is the watch filter of the demo's real CAPI manager (lab.StartCAPI): its
// guest cluster is created with lab.ForRealCAPI (and lab.ForRealCAPK for the real CAPK).
const capiWatchFilter = "demo"

// workerSubnet is where the KubeVirt stand-in takes the worker VMs' pod IPs from.
const workerSubnet = "10.244.1.0/24"

// vmBoot is what runs in every worker VM the KubeVirt stand-in boots: nothing until the
// GuestIngress tour starts the Envoy stand-in in the VMs (set), which the rollout's new VMs
// then run too.
type vmBoot struct {
	mu sync.Mutex
	f  func(*lab.Worker) error
}

func (b *vmBoot) set(f func(*lab.Worker) error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.f = f
}

func (b *vmBoot) onBoot(_ context.Context, w *lab.Worker) error {
	b.mu.Lock()
	f := b.f
	b.mu.Unlock()
	if f == nil {
		return nil
	}
	return f(w)
}

// finishEvictedGuestPods plays the kubelets of the guest: pods CAPI's drain evicted are
// deleted for good (no kubelet runs in the lab to finish their deletion).
func finishEvictedGuestPods(ctx context.Context, l *lab.Lab) error {
	pods := &corev1.PodList{}
	if err := l.Guest.Client.List(ctx, pods); err != nil {
		return err
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; p.DeletionTimestamp != nil {
			if err := l.Guest.Client.Delete(ctx, p, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("deleting evicted guest Pod %s/%s: %w", p.Namespace, p.Name, err)
			}
		}
	}
	return nil
}
