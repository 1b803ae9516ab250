package workerports

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/sets"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// declarePorts gives every worker MachineDeployment a template that declares the required
// ports. A MachineDeployment still rolling out is left alone until it is done: one rollout
// at a time, at the pace of CAPI's own rollout strategy.
func (r *Reconciler) declarePorts(ctx context.Context, s *scope) error {
	revision := s.cluster.Annotations[guestnetv1.TemplateRevisionAnnotation]
	for _, w := range s.workers {
		if !needsNewTemplate(w, revision) {
			continue
		}
		md := w.MachineDeployment
		if rolling, upToDate, desired := w.RollingOut(); rolling {
			ctrl.LoggerFrom(ctx).Info("Waiting for the rollout to finish before declaring more ports",
				"MachineDeployment", md.Name, "upToDate", upToDate, "desired", desired)
			continue
		}
		tmpl, err := ports.Declare(w.Template, w.Analysis.Missing, s.cluster.Name, revision)
		if err != nil {
			return err
		}
		if err := r.Client.Create(ctx, tmpl); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating KubevirtMachineTemplate %s: %w", tmpl.GetName(), err)
		}
		before := md.DeepCopy()
		md.Spec.Template.Spec.InfrastructureRef.Name = tmpl.GetName()
		if err := r.Client.Patch(ctx, md, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return fmt.Errorf("repointing MachineDeployment %s at KubevirtMachineTemplate %s: %w", md.Name, tmpl.GetName(), err)
		}
		note := fmt.Sprintf("MachineDeployment %s now uses KubevirtMachineTemplate %s (was %s), which declares %s; CAPI rolls the workers",
			md.Name, tmpl.GetName(), w.Template.GetName(), describeChange(w.Analysis.Missing, revision))
		ctrl.LoggerFrom(ctx).Info(note)
		r.recorder.Eventf(s.cluster, md, corev1.EventTypeNormal, "WorkerPortsDeclared", "DeclarePorts", note)
	}
	return nil
}

// needsNewTemplate: the template keeps a ports list (masquerade) that lacks required ports,
// or was generated for another template revision than the Cluster asks for.
func needsNewTemplate(w ports.Workers, revision string) bool {
	if w.TemplateErr != nil || w.TopologyOwned() {
		return false
	}
	switch w.Analysis.State {
	case ports.PortsMissing:
		return true
	case ports.PortsDeclared:
		return ports.Revision(w.Template) != revision
	}
	return false
}

func describeChange(missing ports.Set, revision string) string {
	if len(missing) == 0 {
		return "the same ports for template revision " + fmt.Sprintf("%q", revision)
	}
	return "the missing ports " + missing.String()
}

// deleteUnusedTemplates deletes the templates guestnet generated for the cluster that no
// MachineDeployment or MachineSet references any more (an old MachineSet keeps its template
// until CAPI deletes it). The cache may not have seen a MachineDeployment this reconcile just
// repointed, so candidates are checked again against the API server before anything is deleted.
func (r *Reconciler) deleteUnusedTemplates(ctx context.Context, s *scope) error {
	generated := &unstructured.UnstructuredList{}
	generated.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK.GroupVersion().WithKind(ports.KubevirtMachineTemplateGVK.Kind + "List"))
	if err := r.Client.List(ctx, generated, client.InNamespace(s.cluster.Namespace), client.MatchingLabels{guestnetv1.GeneratedTemplateLabel: s.cluster.Name}); err != nil {
		return err
	}
	if len(generated.Items) == 0 {
		return nil
	}
	used, err := templatesInUse(ctx, r.Client, s.cluster)
	if err != nil {
		return err
	}
	var unused []unstructured.Unstructured
	for _, tmpl := range generated.Items {
		if !used.Has(tmpl.GetName()) {
			unused = append(unused, tmpl)
		}
	}
	if len(unused) == 0 {
		return nil
	}
	if used, err = templatesInUse(ctx, r.APIReader, s.cluster); err != nil {
		return err
	}
	for i := range unused {
		tmpl := &unused[i]
		if used.Has(tmpl.GetName()) {
			continue
		}
		uid := tmpl.GetUID()
		if err := r.Client.Delete(ctx, tmpl, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting unused KubevirtMachineTemplate %s: %w", tmpl.GetName(), err)
		}
		r.recorder.Eventf(s.cluster, nil, corev1.EventTypeNormal, "WorkerTemplateDeleted", "DeclarePorts",
			"Deleted KubevirtMachineTemplate %s: guestnet generated it and nothing uses it any more", tmpl.GetName())
	}
	return nil
}

// templatesInUse names the infrastructure templates the cluster's MachineDeployments and
// MachineSets reference, as c sees them.
func templatesInUse(ctx context.Context, c client.Reader, cluster *clusterv1.Cluster) (sets.Set[string], error) {
	inCluster := []client.ListOption{client.InNamespace(cluster.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name}}
	used := sets.New[string]()
	mds := &clusterv1.MachineDeploymentList{}
	if err := c.List(ctx, mds, inCluster...); err != nil {
		return nil, err
	}
	for _, md := range mds.Items {
		used.Insert(md.Spec.Template.Spec.InfrastructureRef.Name)
	}
	machineSets := &clusterv1.MachineSetList{}
	if err := c.List(ctx, machineSets, inCluster...); err != nil {
		return nil, err
	}
	for _, ms := range machineSets.Items {
		used.Insert(ms.Spec.Template.Spec.InfrastructureRef.Name)
	}
	return used, nil
}
