package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// capiWatchFilter is the watch filter of the demo's real CAPI manager (lab.StartCAPI): its
// guest cluster is created with lab.ForRealCAPI.
const capiWatchFilter = "demo"

// playCAPK is one step of what CAPK, KubeVirt and the VMs' kubelets would do for the real
// CAPI of the demo: a worker VM (lab.AddWorker, named after its KubevirtMachine, with the
// next free IP and what serve starts in it) for every new KubevirtMachine, which then boots
// and joins (lab.ProvisionKubevirtMachines); the VM of every deleted KubevirtMachine goes
// (lab.RemoveWorker, lab.ReleaseDeletedKubevirtMachines); pods a drain evicted are gone
// (no kubelet runs in the lab to finish their deletion). workers holds the running ones by
// name.
func playCAPK(ctx context.Context, l *lab.Lab, gc *lab.GuestCluster, workers map[string]*lab.Worker, nextIP func() string, serve func(*lab.Worker) error) error {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK.GroupVersion().WithKind("KubevirtMachineList"))
	if err := l.Host.Client.List(ctx, list, client.InNamespace(gc.Namespace)); err != nil {
		return err
	}
	for _, m := range list.Items {
		w, running := workers[m.GetName()]
		switch {
		case m.GetDeletionTimestamp() == nil && !running:
			w, err := l.AddWorker(ctx, gc, m.GetName(), nextIP())
			if err != nil {
				return err
			}
			if serve != nil {
				if err := serve(w); err != nil {
					return err
				}
			}
			workers[m.GetName()] = w
		case m.GetDeletionTimestamp() != nil && running:
			if err := l.RemoveWorker(ctx, gc, w); err != nil {
				return err
			}
			delete(workers, m.GetName())
		}
	}
	if _, err := l.ProvisionKubevirtMachines(ctx, gc.Namespace); err != nil {
		return err
	}
	if _, err := l.ReleaseDeletedKubevirtMachines(ctx, gc.Namespace); err != nil {
		return err
	}
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

// sortedWorkers returns the workers ordered by name.
func sortedWorkers(workers map[string]*lab.Worker) []*lab.Worker {
	var out []*lab.Worker
	for _, w := range workers {
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b *lab.Worker) int { return strings.Compare(a.Machine, b.Machine) })
	return out
}
