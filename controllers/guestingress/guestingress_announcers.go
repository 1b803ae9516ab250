package guestingress

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	discoveryv1ac "k8s.io/client-go/applyconfigurations/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/optional"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/record"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// localEndpointsResync is how often the endpoints of a host Service of externalTrafficPolicy
// Local are compared again with the guest (where the ingress controller's pods run): the
// guest's EndpointSlices are read live, never cached (a tenant could grow them without
// bound), so a change in the guest is seen within this.
const localEndpointsResync = 10 * time.Second

// gateOf is the gate of the API an announcer kind belongs to.
func (r *Reconciler) gateOf(obj *unstructured.Unstructured) *optional.Gate {
	if obj.GroupVersionKind().Group == ingress.BGPAdvertisementGVK.Group {
		return r.CiliumBGP
	}
	return r.MetalLB
}

// observeAnnouncers reads the BGP and MetalLB objects guestnet made for the GuestIngress
// (those of an API the host does not serve are none), and says, in o.MissingAPI, whether the
// announcer its policy chose needs an API the host does not serve.
func (r *Reconciler) observeAnnouncers(ctx context.Context, o *ingress.Observed) error {
	gi, a := o.GuestIngress, o.Admission
	needed, err := ingress.BuildAnnouncers(gi, a)
	if err != nil {
		needed = ingress.AnnouncerObjects{}
	}
	namespace := a.MetalLB.MetalLBNamespace()
	wanted, slots := needed.List(), o.Announcers.Slots()
	for i, kind := range ingress.AnnouncerKinds().List() {
		gate := r.gateOf(kind)
		if !gate.Installed() {
			if wanted[i] != nil && o.MissingAPI == "" {
				o.MissingAPI = gate.Message()
			}
			continue
		}
		key := client.ObjectKey{Name: hostnames.Pool(gi)}
		if kind.GroupVersionKind().Group != ingress.BGPAdvertisementGVK.Group {
			key.Namespace = namespace
		}
		live, foreign, err := r.getHostObject(ctx, gi, kind, key)
		if err != nil {
			return err
		}
		if foreign != "" && wanted[i] != nil && o.Foreign == "" {
			o.Foreign = foreign
		}
		if live != nil {
			*slots[i] = live.(*unstructured.Unstructured)
		}
	}
	return nil
}

// applyAnnouncers applies the announcer objects of the plan and deletes guestnet's that it no
// longer needs (the pool first, what advertises it after).
func (r *Reconciler) applyAnnouncers(ctx context.Context, s *scope) error {
	live := s.observed.Announcers.List()
	for i, desired := range s.plan.Announcers.List() {
		if err := r.ensureObject(ctx, s, desired, live[i]); err != nil {
			return err
		}
	}
	return nil
}

// observeLocalEndpoints reads, for a GuestIngress of externalTrafficPolicy Local, the workers
// whose guest node runs a ready endpoint of the guest Service: the guest Service's
// EndpointSlices (read live: one list, by the Service's name, in its namespace) and the
// Cluster's worker virt-launcher pods (the manager's cache).
func (r *Reconciler) observeLocalEndpoints(ctx context.Context, s *scope) error {
	gi, o := s.guestIngress, s.observed
	guest, err := r.ClusterCache.GetUncachedClient(ctx, client.ObjectKeyFromObject(s.cluster))
	if err != nil {
		return fmt.Errorf("connecting to the guest to read the guest Service's endpoints: %w", err)
	}
	guestSlices := &discoveryv1.EndpointSliceList{}
	if err := guest.List(ctx, guestSlices, client.InNamespace(gi.Spec.GuestService.Namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: gi.Spec.GuestService.Name}, client.Limit(100)); err != nil {
		return fmt.Errorf("reading the EndpointSlices of Service %s/%s in the guest: %w", gi.Spec.GuestService.Namespace, gi.Spec.GuestService.Name, err)
	}
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.InNamespace(gi.Namespace),
		client.MatchingLabels(virtlauncher.WorkerSelector(gi.Namespace, gi.Spec.ClusterName))); err != nil {
		return fmt.Errorf("listing the worker virt-launcher pods: %w", err)
	}
	o.LocalEndpoints = ingress.LocalEndpoints(guestSlices.Items, pods.Items)
	return nil
}

// applyEndpointSlices applies the host Service's EndpointSlices of the plan (externalTrafficPolicy
// Local) when they differ from what is there, and deletes guestnet's slices of the Service
// that the plan does not have.
func (r *Reconciler) applyEndpointSlices(ctx context.Context, s *scope) error {
	gi := s.guestIngress
	live := &discoveryv1.EndpointSliceList{}
	if err := r.Client.List(ctx, live, client.InNamespace(gi.Namespace), client.MatchingLabels{
		discoveryv1.LabelServiceName: hostnames.HostService(gi),
		discoveryv1.LabelManagedBy:   ingress.EndpointSliceManagedBy,
	}); err != nil {
		return err
	}
	byName := map[string]*discoveryv1.EndpointSlice{}
	for i := range live.Items {
		byName[live.Items[i].Name] = &live.Items[i]
	}
	var errs []error
	var wanted []string
	for _, desired := range s.plan.EndpointSlices {
		wanted = append(wanted, *desired.Name)
		if have := byName[*desired.Name]; have != nil && sliceUpToDate(desired, have) {
			continue
		}
		if err := r.Client.Apply(ctx, desired, client.FieldOwner(ownership.FieldManager), client.ForceOwnership); err != nil {
			errs = append(errs, fmt.Errorf("applying EndpointSlice %s/%s: %w", gi.Namespace, *desired.Name, err))
			continue
		}
		record.Written(ctx, r.recorder, gi, record.Write{Type: corev1.EventTypeNormal, Reason: eventApplied, Action: eventActionApply,
			Object: &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: gi.Namespace, Name: *desired.Name}}, Note: fmt.Sprintf("Applied EndpointSlice %s of host Service %s: %d workers run the ingress controller",
				*desired.Name, hostnames.HostService(gi), len(desired.Endpoints))})
	}
	for name, have := range byName {
		if !slices.Contains(wanted, name) && ownership.IsOwnedBy(have, gi) {
			errs = append(errs, r.deleteObject(ctx, s, have, corev1.EventTypeNormal, eventDeleted, "the host Service selects its workers itself"))
		}
	}
	return kerrors.NewAggregate(errs)
}

// sliceUpToDate reports whether have carries what desired applies: its address type, ports,
// endpoints and labels.
func sliceUpToDate(desired *discoveryv1ac.EndpointSliceApplyConfiguration, have *discoveryv1.EndpointSlice) bool {
	raw, err := json.Marshal(desired)
	if err != nil {
		return false
	}
	want := &discoveryv1.EndpointSlice{}
	if err := json.Unmarshal(raw, want); err != nil {
		return false
	}
	for k, v := range want.Labels {
		if have.Labels[k] != v {
			return false
		}
	}
	return want.AddressType == have.AddressType && equality.Semantic.DeepEqual(want.Ports, have.Ports) &&
		equality.Semantic.DeepEqual(want.Endpoints, have.Endpoints)
}

// deleteAnnouncers deletes the BGP and MetalLB objects guestnet made for the GuestIngress,
// wherever they are (MetalLB's namespace is the policy's), looked up past the cache by their
// marks.
func (r *Reconciler) deleteAnnouncers(ctx context.Context, s *scope, eventType, reason, why string) error {
	gi := s.guestIngress
	var errs []error
	for _, kind := range ingress.AnnouncerKinds().List() {
		if !r.gateOf(kind).Installed() {
			continue
		}
		list := listOf(kind.GroupVersionKind())
		if err := r.APIReader.List(ctx, list, client.MatchingLabels(ownership.SelectGuestIngress(gi))); err != nil {
			if !optional.IsMissing(err) {
				errs = append(errs, err)
			}
			continue
		}
		for i := range list.Items {
			if ownership.IsOwnedBy(&list.Items[i], gi) {
				errs = append(errs, r.deleteObject(ctx, s, &list.Items[i], eventType, reason, why))
			}
		}
	}
	return kerrors.NewAggregate(errs)
}

// isLocalPlan reports whether a reconcile built a host Service of externalTrafficPolicy Local,
// whose endpoints follow the guest on a timer (localEndpointsResync).
func isLocalPlan(s *scope) bool {
	return s.plan != nil && s.plan.Host && ingress.Local(s.guestIngress)
}

// metalLBPools are every MetalLB IPAddressPool, guestnet's and the platform's: admission
// refuses a claim that overlaps one not made for it (MetalLB refuses its whole configuration
// when two pools overlap).
func (w *hostWorld) metalLBPools() []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, len(w.allMetalLBPools))
	for i := range w.allMetalLBPools {
		out[i] = &w.allMetalLBPools[i]
	}
	return out
}

// listMetalLBPools lists every MetalLB IPAddressPool (the cache's own objects) when MetalLB
// is installed.
func (r *Reconciler) listMetalLBPools(ctx context.Context) ([]unstructured.Unstructured, error) {
	if r.MetalLB == nil || !r.MetalLB.Installed() {
		return nil, nil
	}
	list := listOf(ingress.MetalLBPoolGVK)
	if err := r.Client.List(ctx, list, readOnly); err != nil && !optional.IsMissing(err) {
		return nil, fmt.Errorf("listing MetalLB IPAddressPools: %w", err)
	}
	return list.Items, nil
}
