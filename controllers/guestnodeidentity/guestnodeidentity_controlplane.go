package guestnodeidentity

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/nodeidentity"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/optional"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/record"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ssa"
)

// controlPlanePoll is how often the control plane's Service is read again while it has not
// got its address: it is not in the manager's cache (guestnet does not own it), so no watch
// brings the object back when LB-IPAM writes the Service's status.
const controlPlanePoll = 5 * time.Second

// controlPlaneReport is what reconcileControlPlane found, for the ControlPlaneAddress condition.
type controlPlaneReport struct {
	service string
	// decision is the policy's; refused admission is reported from it.
	decision policy.Decision
	// noService says why the Service cannot be used ("" when it can): not named, not found,
	// not a Cilium LoadBalancer.
	noService, noServiceReason string
	// conflict names a pool or L2 policy of guestnet's name that is not guestnet's;
	// noCilium says the host serves no such kind.
	conflict string
	noCilium bool
	// poolConflict is Cilium's PoolConflict condition on guestnet's pool, when True.
	poolConflict *metav1.Condition
	// ip is the Service's load-balancer IP ("" none yet); ipam its Cilium condition.
	ip   string
	ipam *metav1.Condition
	// endpoint is the Cluster's spec.controlPlaneEndpoint host ("" not set yet).
	endpoint string
}

// reconcileControlPlane gives the control plane's host Service the address of
// spec.controlPlane, the GuestIngress way: admitted by a GuestIngressPolicy (never a host
// address), a pool holding only it and an L2 announcement policy, both selecting only that
// Service, and the IP requested on the Service with guestnet's own field manager. It runs
// before guestnet connects to the guest: the guest is reached at that address. What is not
// admitted is withdrawn; while paused, that is all it does. It returns how soon to look again
// (0: a watch brings the object back).
func (r *Reconciler) reconcileControlPlane(ctx context.Context, s *scope) (time.Duration, error) {
	gni := s.gni
	if s.paused && gni.Spec.ControlPlane == nil {
		return 0, nil
	}
	if gni.Spec.ControlPlane == nil {
		conditions.Delete(gni, guestnetv1.ControlPlaneAddressCondition)
		gni.Status.ControlPlaneAddress = ""
		return 0, r.withdrawControlPlane(ctx, s, "spec.controlPlane is not set")
	}
	if s.cluster == nil {
		return 0, nil // ClusterAvailable says ClusterNotFound; the Cluster watch brings it back
	}
	rep := controlPlaneReport{}
	defer func() {
		// Once admission is decided; while paused, only a refusal is news.
		if rep.decision.Reason != "" && (!s.paused || !rep.decision.Admitted) {
			setControlPlaneAddressCondition(gni, rep)
		}
	}()

	service, named := nodeidentity.ControlPlaneService(gni, s.cluster)
	rep.service = service
	host, err := r.HostAddresses.Reserved(ctx)
	if err != nil {
		return 0, err
	}
	world, err := policy.Observe(ctx, r.Client, host)
	if err != nil {
		return 0, err
	}
	in, err := world.Input(ctx, policy.ControlPlaneClaim(gni))
	if err != nil {
		return 0, err
	}
	rep.decision = policy.AdmitControlPlane(in, gni)
	if !rep.decision.Admitted {
		if rep.decision.Detail != "" {
			ctrllog.FromContext(ctx).Info("Control plane address not admitted", "reason", rep.decision.Reason, "detail", rep.decision.Detail)
		}
		return 0, r.withdrawControlPlane(ctx, s, "not admitted: "+rep.decision.Reason)
	}
	if s.paused {
		return 0, nil
	}
	if !named {
		rep.noService, rep.noServiceReason = fmt.Sprintf("guestnet cannot tell the control plane's host Service of Cluster %s (its control plane is a %s): set spec.controlPlane.serviceName",
			gni.Spec.ClusterName, orUnknown(s.cluster.Spec.ControlPlaneRef.Kind)), guestnetv1.ControlPlaneServiceNotFoundReason
		return 0, nil
	}

	pool := nodeidentity.ControlPlanePool(gni, service)
	l2, err := nodeidentity.ControlPlaneL2Policy(gni, service, rep.decision.Announcement)
	if err != nil {
		return 0, err // admission never admits an announcement without interfaces
	}
	livePool, err := r.ensureControlPlaneObject(ctx, s, pool, &rep)
	if err != nil || rep.conflict != "" {
		return 0, err
	}
	if _, err := r.ensureControlPlaneObject(ctx, s, l2, &rep); err != nil || rep.conflict != "" {
		return 0, err
	}
	if c := ingress.ObjectCondition(livePool, ingress.PoolConflictCondition); c != nil && c.Status == metav1.ConditionTrue {
		rep.poolConflict = c
	}

	// What the Service has is read again below; until then it has nothing.
	gni.Status.ControlPlaneAddress = ""
	svc := &corev1.Service{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: gni.Namespace, Name: service}, svc); err != nil {
		if !apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("reading the control plane's Service %s/%s: %w", gni.Namespace, service, err)
		}
		rep.noService, rep.noServiceReason = fmt.Sprintf("Service %s/%s does not exist (yet). %s", gni.Namespace, service, createsTheService(s)),
			guestnetv1.ControlPlaneServiceNotFoundReason
		return controlPlanePoll, nil
	}
	if ok, why := nodeidentity.ServedByCilium(svc); !ok {
		rep.noService, rep.noServiceReason = fmt.Sprintf("Service %s/%s %s. %s", gni.Namespace, service, why, createsTheService(s)),
			guestnetv1.ControlPlaneServiceNotLoadBalancerReason
		return controlPlanePoll, nil
	}
	if err := r.requestIP(ctx, s, svc, gni.Spec.ControlPlane.IP); err != nil {
		return 0, err
	}
	rep.ip, rep.ipam = ingress.LoadBalancerIP(svc), ingress.ServiceCondition(svc, ingress.IPAMRequestSatisfiedCondition)
	rep.endpoint = s.cluster.Spec.ControlPlaneEndpoint.Host
	if rep.ip != gni.Spec.ControlPlane.IP {
		return controlPlanePoll, nil
	}
	gni.Status.ControlPlaneAddress = rep.ip
	return 0, nil
}

// createsTheService says who creates the control plane's Service and how.
func createsTheService(s *scope) string {
	ref := s.cluster.Spec.ControlPlaneRef
	if ref.Kind == nodeidentity.K0smotronControlPlaneKind {
		return fmt.Sprintf("k0smotron creates kmc-%s-lb when %s %s has spec.service.type: LoadBalancer (loadBalancerClass unset or %s)",
			ref.Name, ref.Kind, ref.Name, guestnetv1.DefaultLoadBalancerClass)
	}
	return fmt.Sprintf("Its control plane provider must create it of type LoadBalancer (loadBalancerClass unset or %s), or name the right one in spec.controlPlane.serviceName",
		guestnetv1.DefaultLoadBalancerClass)
}

func orUnknown(s string) string {
	if s == "" {
		return "kind not known yet"
	}
	return s
}

// ensureControlPlaneObject applies desired (the pool or the L2 policy) unless it is up to
// date, and returns it as it is live. An object of that name that is not guestnet's for this
// GuestNodeIdentity is left alone and reported in rep.conflict.
func (r *Reconciler) ensureControlPlaneObject(ctx context.Context, s *scope, desired *unstructured.Unstructured, rep *controlPlaneReport) (*unstructured.Unstructured, error) {
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(desired.GroupVersionKind())
	err := r.Client.Get(ctx, client.ObjectKey{Name: desired.GetName()}, live)
	switch {
	case optional.IsMissing(err):
		rep.conflict, rep.noCilium = fmt.Sprintf("the host does not serve %s: install Cilium with LB-IPAM and L2 announcements", desired.GetKind()), true
		return nil, nil
	case apierrors.IsNotFound(err):
		live = nil
	case err != nil:
		return nil, fmt.Errorf("reading %s %s: %w", desired.GetKind(), desired.GetName(), err)
	case !ownership.IsControlPlaneObject(live, s.gni):
		rep.conflict = fmt.Sprintf("%s %s exists and is not guestnet's for this GuestNodeIdentity; guestnet leaves it alone. Delete it, or ask the host admin",
			desired.GetKind(), desired.GetName())
		return nil, nil
	}
	if live != nil && ssa.ObjectUpToDate(desired, live) {
		return live, nil
	}
	applied := desired.DeepCopy()
	if err := ssa.ApplyObject(ctx, r.Client, applied, ownership.FieldManager); err != nil {
		return nil, fmt.Errorf("applying %s %s: %w", desired.GetKind(), desired.GetName(), err)
	}
	record.Written(ctx, r.recorder, s.gni, record.Write{Type: corev1.EventTypeNormal, Reason: "ControlPlaneAddressApplied", Action: "Apply",
		Object: applied, Note: fmt.Sprintf("Applied %s %s for the control plane address %s", desired.GetKind(), desired.GetName(), s.gni.Spec.ControlPlane.IP)})
	return applied, nil
}

// requestIP makes the Service's lbipam.cilium.io/ips what guestnet requests (ip; "" takes
// guestnet's request off), with guestnet's own field manager: nothing else of the Service,
// which its control plane provider owns, is touched.
func (r *Reconciler) requestIP(ctx context.Context, s *scope, svc *corev1.Service, ip string) error {
	desired := corev1ac.Service(svc.Name, svc.Namespace)
	if ip != "" {
		desired.WithAnnotations(map[string]string{ingress.LBIPAMIPsAnnotation: ip})
	} else if !nodeidentity.OwnsIPRequest(svc, ownership.FieldManager) {
		return nil
	}
	_, applied, err := ssa.EnsureService(ctx, r.Client, desired, svc)
	if err != nil || !applied {
		return err
	}
	note := fmt.Sprintf("Requested %s for Service %s/%s (%s)", ip, svc.Namespace, svc.Name, ingress.LBIPAMIPsAnnotation)
	if ip == "" {
		note = fmt.Sprintf("Took guestnet's %s off Service %s/%s", ingress.LBIPAMIPsAnnotation, svc.Namespace, svc.Name)
	}
	record.Written(ctx, r.recorder, s.gni, record.Write{Type: corev1.EventTypeNormal, Reason: "ControlPlaneAddressRequested", Action: "Apply", Object: svc, Note: note})
	return nil
}

// withdrawControlPlane deletes the pool and L2 policy guestnet made for the control plane
// address of s.gni and takes its IP request off the Service they selected, whatever
// spec.controlPlane says now: when it is not set, not admitted, or the object is being deleted.
func (r *Reconciler) withdrawControlPlane(ctx context.Context, s *scope, why string) error {
	gni := s.gni
	name := hostnames.ControlPlanePool(gni)
	var errs []error
	var selected string
	for _, obj := range []*unstructured.Unstructured{ingress.NewPool(), ingress.NewL2Policy()} {
		err := r.Client.Get(ctx, client.ObjectKey{Name: name}, obj)
		if optional.IsMissing(err) || apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("reading %s %s: %w", obj.GetKind(), name, err))
			continue
		}
		if !ownership.IsControlPlaneObject(obj, gni) || !obj.GetDeletionTimestamp().IsZero() {
			continue
		}
		if svc, _, _ := unstructured.NestedString(obj.Object, "spec", "serviceSelector", "matchLabels", ingress.ServiceNameKey); svc != "" {
			selected = svc
		}
		uid := obj.GetUID()
		if err := r.Client.Delete(ctx, obj, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("deleting %s %s: %w", obj.GetKind(), name, err))
			continue
		}
		record.Written(ctx, r.recorder, gni, record.Write{Type: corev1.EventTypeWarning, Reason: "ControlPlaneAddressWithdrawn", Action: "Delete",
			Object: obj, Note: fmt.Sprintf("Deleted %s %s: %s", obj.GetKind(), name, why)})
	}
	// The Service is read (live: it is not in the cache) only when guestnet had made something
	// for it: a GuestNodeIdentity without a control plane address costs no read.
	if selected != "" {
		svc := &corev1.Service{}
		err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: gni.Namespace, Name: selected}, svc)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			errs = append(errs, fmt.Errorf("reading Service %s/%s: %w", gni.Namespace, selected, err))
		default:
			errs = append(errs, r.requestIP(ctx, s, svc, ""))
		}
	}
	gni.Status.ControlPlaneAddress = ""
	return errors.Join(errs...)
}

// setControlPlaneAddressCondition sets ControlPlaneAddress from what reconcileControlPlane
// found; each False message says what to do.
func setControlPlaneAddressCondition(gni *guestnetv1.GuestNodeIdentity, rep controlPlaneReport) {
	c := metav1.Condition{Type: guestnetv1.ControlPlaneAddressCondition, Status: metav1.ConditionFalse}
	ip := gni.Spec.ControlPlane.IP
	switch d := rep.decision; {
	case !d.Admitted:
		c.Reason, c.Message = d.Reason, d.Message
	case rep.noService != "":
		c.Reason, c.Message = rep.noServiceReason, rep.noService
	case rep.noCilium:
		c.Reason, c.Message = guestnetv1.CiliumLBIPAMNotInstalledReason, rep.conflict
	case rep.conflict != "":
		c.Reason, c.Message = guestnetv1.HostObjectConflictReason, rep.conflict
	case rep.poolConflict != nil:
		c.Reason, c.Message = guestnetv1.PoolConflictReason, fmt.Sprintf("Cilium does not hand out %s: pool %s overlaps another pool (%s). Another GuestIngress or pool holds the address: ask the host admin",
			ip, hostnames.ControlPlanePool(gni), rep.poolConflict.Message)
	case rep.ip != ip:
		c.Reason = guestnetv1.IPPendingReason
		c.Message = fmt.Sprintf("Waiting for Cilium LB-IPAM to give Service %s/%s the address %s", gni.Namespace, rep.service, ip)
		if rep.ip != "" {
			c.Message += " (it has " + rep.ip + ")"
		}
		if rep.ipam != nil && rep.ipam.Status != metav1.ConditionTrue {
			c.Message += fmt.Sprintf("; Cilium says %s=%s (%s: %s)", ingress.IPAMRequestSatisfiedCondition, rep.ipam.Status, rep.ipam.Reason, rep.ipam.Message)
		}
	case rep.endpoint != "" && rep.endpoint != ip:
		c.Reason = guestnetv1.ControlPlaneEndpointElsewhereReason
		c.Message = fmt.Sprintf("Service %s/%s has %s, but the Cluster's control plane endpoint is %s, which Cluster API never changes once set: "+
			"the workers join at %s. Create the Cluster with spec.controlPlane set from the start", gni.Namespace, rep.service, ip, rep.endpoint, rep.endpoint)
	default:
		c.Status, c.Reason = metav1.ConditionTrue, guestnetv1.ControlPlaneAddressReadyReason
		c.Message = fmt.Sprintf("Service %s/%s has %s (GuestIngressPolicy %s admits it)", gni.Namespace, rep.service, ip, rep.decision.Policy)
		if rep.endpoint == "" {
			c.Message += "; the control plane provider makes it the Cluster's endpoint"
		}
	}
	conditions.Set(gni, c)
}
