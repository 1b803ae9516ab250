package guestingress

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/record"
)

// Held within admitted, and no orphans (docs/decisions/0008-held-within-admitted.md).
//
// Every reconcile of a GuestIngress this instance serves starts here, before pause, deletion
// or the spec are looked at: what the GuestIngress's host objects hold is compared with what
// its GuestIngressPolicy admits now (policy.HeldBeyondAdmitted), and what falls outside is
// taken off. Pause means "make no new changes", never "keep what was revoked".
//
// A reconcile of a GuestIngress that is gone, is another instance's (watch filter) or is a new
// one under an old name (another UID) sweeps what this instance made for the old one: its
// pools, L2 policies and host Services, checked against the apiserver and UID-exact.

// eventRevoked is the reason of the Warning events of what guestnet takes off host objects
// because the policy no longer admits it (deletions while the GuestIngress is not admitted at
// all carry the refusal's reason, as its withdrawals do).
const eventRevoked = "Revoked"

// eventActionPatch is the events.k8s.io action of a narrowing.
const eventActionPatch = "Patch"

// reconcileHeld keeps what the GuestIngress holds on the host within what its policy admits
// now: it reads the host (observeHost), sweeps what was made for a former GuestIngress of the
// same name (s.swept: the reconcile stops there, the deletions' events bring it back), then
// deletes or narrows what the policy does not admit, and adopts objects made before guestnet
// marked them with the GuestIngress's UID. s.host is left as it is after these writes.
func (r *Reconciler) reconcileHeld(ctx context.Context, s *scope) error {
	if !r.Cilium.Installed() {
		return nil // guestnet reads and creates nothing without Cilium's LB-IPAM
	}
	if err := r.observeHost(ctx, s); err != nil {
		return err
	}
	gi, o := s.guestIngress, s.host
	made, err := r.madeFor(ctx, client.ObjectKeyFromObject(gi))
	if err != nil {
		return err
	}
	swept, err := r.sweep(ctx, client.ObjectKeyFromObject(gi), made, gi)
	if err != nil || swept {
		s.swept = swept
		return err
	}

	ex := policy.HeldBeyondAdmitted(s.admissionInput, o.Admission, policy.Held{HostService: o.HostService, Pool: o.Pool, L2Policy: o.L2Policy,
		Announcers: o.Announcers})
	reason := eventRevoked
	if !o.Admission.Admitted {
		reason = o.Admission.Reason
	}
	var errs []error
	if o.HostService, err = cut(ctx, r, s, o.HostService, ex.HostService, reason); err != nil {
		errs = append(errs, err)
	}
	if o.Pool, err = cut(ctx, r, s, o.Pool, ex.Pool, reason); err != nil {
		errs = append(errs, err)
	}
	if o.L2Policy, err = cut(ctx, r, s, o.L2Policy, ex.L2Policy, reason); err != nil {
		errs = append(errs, err)
	}
	for i, slot := range o.Announcers.Slots() {
		if *slot, err = cut(ctx, r, s, *slot, ex.Announcers[i], reason); err != nil {
			errs = append(errs, err)
		}
	}
	s.revoked = !ex.None()
	for _, obj := range []**unstructured.Unstructured{&o.Pool, &o.L2Policy} {
		if *obj, err = r.adopt(ctx, s, *obj); err != nil {
			errs = append(errs, err)
		}
	}
	return kerrors.NewAggregate(errs)
}

// cut deletes live (preconditions on its UID and resourceVersion), or patches it to what is
// left of it (a merge patch with optimistic locking, as guestnet's field manager), as c says, with a Warning event that says what the
// policy does not admit; it returns the object as it is afterwards (nil when deleted).
func cut[T interface {
	client.Object
	comparable
}](ctx context.Context, r *Reconciler, s *scope, live T, c policy.Cut[T], reason string) (T, error) {
	var none T
	if c.Within() || live == none || !live.GetDeletionTimestamp().IsZero() {
		return live, nil
	}
	what := strings.Join(c.Outside, "; ")
	if c.Delete {
		// Exactly the version judged: a cache behind the apiserver never deletes what it has not seen.
		uid, version := live.GetUID(), live.GetResourceVersion()
		if err := r.Client.Delete(ctx, live, client.Preconditions{UID: &uid, ResourceVersion: &version}); err != nil {
			if apierrors.IsNotFound(err) {
				return none, nil
			}
			return live, fmt.Errorf("deleting %s %s, which holds what the policy does not admit: %w", kindOf(live), client.ObjectKeyFromObject(live), err)
		}
		record.Written(ctx, r.recorder, s.guestIngress, record.Write{Type: corev1.EventTypeWarning, Reason: reason, Action: eventActionDelete,
			Object: live, Note: fmt.Sprintf("Deleted %s %s: it holds what the GuestIngressPolicy does not admit now: %s", kindOf(live), client.ObjectKeyFromObject(live), what)})
		return none, nil
	}
	narrowed := c.Narrowed
	if err := r.Client.Patch(ctx, narrowed, client.MergeFromWithOptions(live, client.MergeFromWithOptimisticLock{}),
		client.FieldOwner(ownership.FieldManager)); err != nil {
		if apierrors.IsNotFound(err) {
			return none, nil
		}
		return live, fmt.Errorf("taking off %s %s what the policy does not admit: %w", kindOf(live), client.ObjectKeyFromObject(live), err)
	}
	record.Written(ctx, r.recorder, s.guestIngress, record.Write{Type: corev1.EventTypeWarning, Reason: reason, Action: eventActionPatch,
		Object: narrowed, Note: fmt.Sprintf("Took off %s %s what the GuestIngressPolicy does not admit now: %s", kindOf(live), client.ObjectKeyFromObject(live), what)})
	return narrowed, nil
}

// adopt writes the GuestIngress's UID and this instance's mark on a pool or L2 policy that
// lacks them (made by a guestnet before it recorded them), so that the sweep can tell later
// whose it is. It returns the object as it is afterwards.
func (r *Reconciler) adopt(ctx context.Context, s *scope, live *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	gi := s.guestIngress
	if live == nil || gi.UID == "" || !ownership.NeedsMarks(live, gi) {
		return live, nil
	}
	marked := live.DeepCopy()
	annotations := marked.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	for k, v := range ownership.Annotations(gi) {
		annotations[k] = v
	}
	if ownership.InstanceMark(gi) == "" {
		delete(annotations, ownership.WatchFilterAnnotation)
	}
	marked.SetAnnotations(annotations)
	if err := r.Client.Patch(ctx, marked, client.MergeFromWithOptions(live, client.MergeFromWithOptimisticLock{}),
		client.FieldOwner(ownership.FieldManager)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return live, fmt.Errorf("marking %s %s with its GuestIngress's UID: %w", kindOf(live), live.GetName(), err)
	}
	record.Written(ctx, r.recorder, gi, record.Write{Type: corev1.EventTypeNormal, Reason: eventApplied, Action: eventActionPatch,
		Object: marked, Note: fmt.Sprintf("Marked %s %s with the UID of this GuestIngress (%s) and the watch filter of its manager", kindOf(live), live.GetName(), gi.UID)})
	return marked, nil
}

// --- the sweep ------------------------------------------------------------------------------

// sweepGone is the reconcile of a GuestIngress key that this instance does not serve: the
// object is gone, or another instance's (its watch-filter label changed). What this instance
// made for it is swept.
func (r *Reconciler) sweepGone(ctx context.Context, key types.NamespacedName) error {
	if !r.Cilium.Installed() {
		return nil
	}
	candidates, err := r.madeFor(ctx, key)
	if err != nil {
		return err
	}
	_, err = r.sweep(ctx, key, candidates, nil)
	return err
}

// sweep deletes, of candidates (host objects this instance made for the GuestIngress key),
// those made for a GuestIngress that no longer is: key is gone, another instance's, or has
// another UID (ownership.Orphaned). known is the GuestIngress as the caller read it (nil when
// it has none): when nothing can be an orphan by it, nothing is read; else the GuestIngress is
// read from the apiserver, never from the cache alone, before anything is deleted. The host
// Services that the pools and L2 policies swept name are swept too, read past the cache (a
// tenant may have stripped their labels). swept reports whether anything was deleted.
func (r *Reconciler) sweep(ctx context.Context, key types.NamespacedName, candidates []client.Object, known *guestnetv1.GuestIngress) (swept bool, err error) {
	if known != nil {
		candidates = slices.DeleteFunc(slices.Clone(candidates), func(o client.Object) bool { return !ownership.Orphaned(o, known, r.WatchFilterValue) })
	}
	if len(candidates) == 0 {
		return false, nil
	}
	live := &guestnetv1.GuestIngress{}
	if err := r.APIReader.Get(ctx, key, live); err != nil {
		if !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("reading GuestIngress %s: %w", key, err)
		}
		live = nil
	}
	log := ctrl.LoggerFrom(ctx).WithValues("GuestIngress", key)
	candidates = append(candidates, r.namedServices(ctx, key, candidates, live)...)
	var errs []error
	for _, o := range candidates {
		if !ownership.Orphaned(o, live, r.WatchFilterValue) || !o.GetDeletionTimestamp().IsZero() {
			continue
		}
		uid := o.GetUID()
		if err := r.Client.Delete(ctx, o, client.Preconditions{UID: &uid}); err != nil {
			if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				errs = append(errs, fmt.Errorf("sweeping %s %s: %w", kindOf(o), client.ObjectKeyFromObject(o), err))
			}
			continue
		}
		swept = true
		note := fmt.Sprintf("Deleted %s %s, made for GuestIngress %s (UID %s), which %s", kindOf(o), client.ObjectKeyFromObject(o), key,
			ownership.MadeForUID(o), orphanedBecause(live, r.WatchFilterValue))
		if live != nil {
			record.Written(ctx, r.recorder, live, record.Write{Type: corev1.EventTypeWarning, Reason: eventSwept, Action: eventActionDelete, Object: o, Note: note})
		} else {
			log.Info(note, "reason", eventSwept, "action", eventActionDelete, kindOf(o), client.ObjectKeyFromObject(o))
		}
	}
	return swept, kerrors.NewAggregate(errs)
}

// eventSwept is the reason of a deletion by the sweep.
const eventSwept = "Swept"

func orphanedBecause(live *guestnetv1.GuestIngress, watchFilterValue string) string {
	switch {
	case live == nil:
		return "no longer exists"
	case watchFilterValue != "" && ownership.InstanceMark(live) != watchFilterValue:
		return fmt.Sprintf("no longer carries this manager's watch filter (cluster.x-k8s.io/watch-filter=%s)", watchFilterValue)
	default:
		return fmt.Sprintf("was deleted: GuestIngress %s/%s now has UID %s", live.Namespace, live.Name, live.UID)
	}
}

// namedServices are the host Services that the orphaned pools and L2 policies among
// candidates select (Cilium's io.kubernetes.service.name), and that are not among candidates:
// read from the cache, else from the apiserver, and kept when a GuestIngress of key's name
// controls them.
func (r *Reconciler) namedServices(ctx context.Context, key types.NamespacedName, candidates []client.Object, live *guestnetv1.GuestIngress) []client.Object {
	var names []string
	for _, o := range candidates {
		u, ok := o.(*unstructured.Unstructured)
		if !ok || !ownership.Orphaned(o, live, r.WatchFilterValue) {
			continue
		}
		name, _, _ := unstructured.NestedString(u.Object, "spec", "serviceSelector", "matchLabels", ingress.ServiceNameKey)
		if name != "" && !slices.Contains(names, name) && !slices.ContainsFunc(candidates, func(c client.Object) bool {
			_, isService := c.(*corev1.Service)
			return isService && c.GetName() == name
		}) {
			names = append(names, name)
		}
	}
	var out []client.Object
	for _, name := range names {
		svc := &corev1.Service{}
		k := client.ObjectKey{Namespace: key.Namespace, Name: name}
		err := r.Client.Get(ctx, k, svc)
		if apierrors.IsNotFound(err) {
			err = r.APIReader.Get(ctx, k, svc)
		}
		if err != nil {
			continue // gone (or unreadable: the next sweep of the key tries again)
		}
		if ref := ownerOf(svc); ref != "" && ref == key.Name {
			out = append(out, svc)
		}
	}
	return out
}

// ownerOf is the name of the GuestIngress that controls svc, "" when none does.
func ownerOf(svc *corev1.Service) string {
	for _, ref := range svc.OwnerReferences {
		if ref.Controller != nil && *ref.Controller && ref.Kind == "GuestIngress" && ref.APIVersion == guestnetv1.GroupVersion.String() {
			return ref.Name
		}
	}
	return ""
}
