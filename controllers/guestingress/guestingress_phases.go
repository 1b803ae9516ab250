package guestingress

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// readyConditions are the conditions Ready summarises. Those the controller does not report
// yet count as Unknown, so Ready cannot claim an exposure that does not exist.
var readyConditions = []string{
	guestnetv1.ClusterAvailableCondition,
	guestnetv1.GuestServiceReadyCondition,
	guestnetv1.LoadBalancerReadyCondition,
	guestnetv1.EndpointsReadyCondition,
	guestnetv1.PortsDeclaredCondition,
}

// ownedConditions are all conditions this controller writes; the patch helper lets its
// values win over concurrent writers.
var ownedConditions = append([]string{guestnetv1.ReadyCondition, guestnetv1.PausedCondition}, readyConditions...)

// reconcileNormal makes the host side match the spec once the guest cluster is reachable.
func (r *Reconciler) reconcileNormal(ctx context.Context, s *scope) (ctrl.Result, error) {
	guestClient, err := clusterscope.Connect(ctx, r.ClusterCache, s.guestIngress, s.cluster)
	if err != nil || guestClient == nil {
		// Not reachable yet: the Cluster watch or the ClusterCache connect event brings us back.
		return ctrl.Result{}, err
	}
	s.guestClient = guestClient

	// The workerports controller declares the ports; this object reports whether its own are.
	if err := ports.ReportPortsDeclared(ctx, r.Client, guestClient, s.cluster, s.guestIngress, ports.ForGuestIngress(s.guestIngress)); err != nil {
		return ctrl.Result{}, err
	}

	// TODO(next issue: GuestIngress host exposure): enforce the guest Service's nodePorts,
	// create the host LoadBalancer Service selecting the worker virt-launcher pods
	// (cluster.x-k8s.io/cluster-name, cluster.x-k8s.io/role=worker, kubevirt.io=virt-launcher),
	// the CiliumLoadBalancerIPPool and CiliumL2AnnouncementPolicy, and report
	// GuestServiceReady, LoadBalancerReady, EndpointsReady and PortsDeclared.
	return ctrl.Result{}, nil
}

// reconcileDelete undoes what reconcileNormal did, then releases the object.
func (r *Reconciler) reconcileDelete(_ context.Context, s *scope) (ctrl.Result, error) {
	// TODO(next issue: GuestIngress host exposure): delete the host Service, pool and L2
	// policy guestnet created, and release the declared ports, before the finalizer goes.
	controllerutil.RemoveFinalizer(s.guestIngress, guestnetv1.GuestIngressFinalizer)
	return ctrl.Result{}, nil
}

// setReadyCondition summarises readyConditions into Ready.
func setReadyCondition(guestIngress *guestnetv1.GuestIngress) {
	clusterscope.SetReadyCondition(guestIngress, readyConditions...)
}
