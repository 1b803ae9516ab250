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
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/metrics"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/record"
)

// declarePorts applies the plan internal/ports made for every worker MachineDeployment:
// create the copy that declares the ports (unless it exists as guestnet writes it) and
// repoint the MachineDeployment at it. A plan that waits (guestnet's own rollout still
// running) or refuses (a reverted repoint, a name taken by an object guestnet did not write)
// writes nothing; the PortsDeclared conditions say why and what to do.
func (r *Reconciler) declarePorts(ctx context.Context, s *scope) error {
	log := ctrl.LoggerFrom(ctx)
	for i := range s.workers {
		w := &s.workers[i]
		md := w.MachineDeployment
		switch w.Plan.Action {
		case ports.Repoint:
			if err := r.repoint(ctx, s, w); err != nil {
				return err
			}
		case ports.WaitForRollout:
			_, upToDate, desired := w.RollingOut()
			log.Info("Waiting for the rollout to finish before declaring more ports",
				"MachineDeployment", md.Name, "upToDate", upToDate, "desired", desired)
		case ports.Reverted:
			log.Info("Not repointing: the MachineDeployment was set back to the template guestnet had replaced",
				"MachineDeployment", md.Name, "template", w.Template.GetName(), "by", w.Plan.RevertedBy)
			r.recorder.Eventf(s.cluster, md, corev1.EventTypeWarning, guestnetv1.RepointRevertedReason, "DeclarePorts",
				"MachineDeployment %s was set back to KubevirtMachineTemplate %s by %s after guestnet repointed it: guestnet no longer repoints it; %s",
				md.Name, w.Template.GetName(), w.Plan.RevertedByText(), w.SourcePorts())
		case ports.NameTaken:
			log.Info("Not adopting the object that holds the name of the copy", "MachineDeployment", md.Name, "conflict", w.Plan.Conflict)
			r.recorder.Eventf(s.cluster, md, corev1.EventTypeWarning, guestnetv1.TemplateNameTakenReason, "DeclarePorts", "%s", w.Plan.Conflict)
		}
	}
	return nil
}

// repoint creates the copy w's plan names (unless it exists as guestnet writes it) and points
// the MachineDeployment at it, recording in the same patch the user's template it replaced
// and the revision it rolls out. The patch carries the resourceVersion read: a MachineDeployment
// changed since (by a user, a GitOps tool, CAPI) is not overwritten; the change brings the
// next reconcile.
func (r *Reconciler) repoint(ctx context.Context, s *scope, w *ports.Workers) error {
	md, tmpl := w.MachineDeployment, w.Plan.Template
	if !w.Plan.Exists {
		err := r.Client.Create(ctx, tmpl, client.FieldOwner(ownership.FieldManager))
		switch {
		case apierrors.IsAlreadyExists(err):
			// The cache had not seen it: decide on what the API server holds.
			if conflict := r.adoptable(ctx, tmpl, s.cluster.Name); conflict != nil {
				ctrl.LoggerFrom(ctx).Info("Not adopting the object that holds the name of the copy", "MachineDeployment", md.Name, "conflict", conflict.Error())
				r.recorder.Eventf(s.cluster, md, corev1.EventTypeWarning, guestnetv1.TemplateNameTakenReason, "DeclarePorts", "%s", conflict.Error())
				return nil
			}
		case err != nil:
			return fmt.Errorf("creating KubevirtMachineTemplate %s: %w", tmpl.GetName(), err)
		default:
			record.Written(ctx, r.recorder, s.cluster, record.Write{Type: corev1.EventTypeNormal, Reason: "WorkerTemplateCreated", Action: "DeclarePorts",
				Object: tmpl, Note: fmt.Sprintf("Created KubevirtMachineTemplate %s: a copy of %s that declares %s", tmpl.GetName(), w.Template.GetName(), describeChange(w.Analysis.Missing, w.Plan.Revision))})
		}
	}

	before := md.DeepCopy()
	md.Spec.Template.Spec.InfrastructureRef.Name = tmpl.GetName()
	if md.Annotations == nil {
		md.Annotations = map[string]string{}
	}
	// The user's template, also when this replaces an earlier copy: a source that sets it
	// back is then recognised after any number of copies.
	md.Annotations[guestnetv1.RepointedFromAnnotation] = ports.BaseName(w.Template)
	if w.Plan.Revision != "" {
		md.Annotations[guestnetv1.TemplateRevisionAnnotation] = w.Plan.Revision
	} else {
		delete(md.Annotations, guestnetv1.TemplateRevisionAnnotation)
	}
	if err := r.Client.Patch(ctx, md, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}), client.FieldOwner(ownership.FieldManager)); err != nil {
		return fmt.Errorf("repointing MachineDeployment %s at KubevirtMachineTemplate %s: %w", md.Name, tmpl.GetName(), err)
	}
	metrics.WorkerRolloutTriggered()
	record.Written(ctx, r.recorder, s.cluster, record.Write{Type: corev1.EventTypeNormal, Reason: "WorkerPortsDeclared", Action: "DeclarePorts",
		Object: md, Note: fmt.Sprintf("MachineDeployment %s now uses KubevirtMachineTemplate %s (was %s), which declares %s; CAPI rolls the workers",
			md.Name, tmpl.GetName(), w.Template.GetName(), describeChange(w.Analysis.Missing, w.Plan.Revision))})
	return nil
}

// adoptable reads the object holding the copy's name from the API server and says whether it
// is the copy guestnet writes (ports.Adoptable).
func (r *Reconciler) adoptable(ctx context.Context, desired *unstructured.Unstructured, cluster string) error {
	existing := &unstructured.Unstructured{}
	existing.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK)
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(desired), existing); err != nil {
		return fmt.Errorf("reading KubevirtMachineTemplate %s: %w", desired.GetName(), err)
	}
	return ports.Adoptable(existing, desired, cluster)
}

func describeChange(missing ports.Set, revision string) string {
	if len(missing) == 0 {
		return "the same ports for template revision " + fmt.Sprintf("%q", revision)
	}
	return "the missing ports " + missing.String()
}

// deleteUnusedTemplates deletes the templates guestnet generated for the cluster that no
// MachineDeployment or MachineSet of the namespace references any more, whichever Cluster
// they belong to (an old MachineSet keeps its template until CAPI deletes it). What the
// cluster's own workers reference (from the cache) only preselects candidates; whether a
// candidate is referenced is read from the API server, which has seen every repoint, this
// reconcile's included.
func (r *Reconciler) deleteUnusedTemplates(ctx context.Context, s *scope) error {
	generated := &unstructured.UnstructuredList{}
	generated.SetGroupVersionKind(ports.KubevirtMachineTemplateGVK.GroupVersion().WithKind(ports.KubevirtMachineTemplateGVK.Kind + "List"))
	if err := r.Client.List(ctx, generated, client.InNamespace(s.cluster.Namespace), client.MatchingLabels{guestnetv1.GeneratedTemplateLabel: s.cluster.Name}); err != nil {
		return err
	}
	inUse := sets.New[string]()
	for _, w := range s.workers {
		inUse.Insert(w.MachineDeployment.Spec.Template.Spec.InfrastructureRef.Name)
	}
	var candidates []unstructured.Unstructured
	for _, tmpl := range generated.Items {
		if !inUse.Has(tmpl.GetName()) {
			candidates = append(candidates, tmpl)
		}
	}
	if len(candidates) == 0 {
		return nil
	}
	referenced, err := templatesReferenced(ctx, r.APIReader, s.cluster.Namespace)
	if err != nil {
		return err
	}
	for i := range candidates {
		tmpl := &candidates[i]
		if referenced.Has(tmpl.GetName()) {
			continue
		}
		uid := tmpl.GetUID()
		err := r.Client.Delete(ctx, tmpl, client.Preconditions{UID: &uid})
		if apierrors.IsNotFound(err) {
			continue // already gone (a reconcile on a cache that had not seen it go): nothing to tell
		}
		if err != nil {
			return fmt.Errorf("deleting unused KubevirtMachineTemplate %s: %w", tmpl.GetName(), err)
		}
		record.Written(ctx, r.recorder, s.cluster, record.Write{Type: corev1.EventTypeNormal, Reason: "WorkerTemplateDeleted", Action: "DeclarePorts",
			Object: tmpl, Note: fmt.Sprintf("Deleted KubevirtMachineTemplate %s: guestnet generated it and no MachineDeployment or MachineSet references it any more", tmpl.GetName())})
	}
	return nil
}

// templatesReferenced names the KubevirtMachineTemplates that the MachineDeployments and
// MachineSets of namespace reference, as c sees them, whichever Cluster they belong to.
func templatesReferenced(ctx context.Context, c client.Reader, namespace string) (sets.Set[string], error) {
	used := sets.New[string]()
	mds := &clusterv1.MachineDeploymentList{}
	if err := c.List(ctx, mds, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	for _, md := range mds.Items {
		used.Insert(templateName(md.Spec.Template.Spec.InfrastructureRef))
	}
	machineSets := &clusterv1.MachineSetList{}
	if err := c.List(ctx, machineSets, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	for _, ms := range machineSets.Items {
		used.Insert(templateName(ms.Spec.Template.Spec.InfrastructureRef))
	}
	used.Delete("")
	return used, nil
}

// templateName is the name ref gives when it references a KubevirtMachineTemplate.
func templateName(ref clusterv1.ContractVersionedObjectReference) string {
	if ref.Kind != ports.KubevirtMachineTemplateGVK.Kind || ref.APIGroup != ports.KubevirtMachineTemplateGVK.Group {
		return ""
	}
	return ref.Name
}
