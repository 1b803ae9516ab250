package ports

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// Action is what guestnet does about one worker MachineDeployment.
type Action string

const (
	// NoAction means the template declares what is required (or has no ports list, or is not
	// masquerade), or guestnet may not edit the MachineDeployment (ClusterClass topology,
	// template error): the conditions say what the user can do.
	NoAction Action = "None"
	// Repoint creates Plan.Template (unless Plan.Exists) and points the MachineDeployment at it.
	Repoint Action = "Repoint"
	// WaitForRollout means CAPI is still rolling the workers to a copy guestnet generated; the next
	// copy follows once that rollout is done (one rollout at a time, at CAPI's pace).
	WaitForRollout Action = "WaitForRollout"
	// Reverted means after guestnet repointed the MachineDeployment, someone else set it back to
	// the template guestnet had replaced (RepointedFromAnnotation). guestnet does not fight:
	// the template's source must declare the ports.
	Reverted Action = "Reverted"
	// NameTaken means an object guestnet did not write holds the copy's name; guestnet does not
	// adopt it.
	NameTaken Action = "NameTaken"
)

// Plan is what guestnet does about one worker MachineDeployment, decided from what was read.
type Plan struct {
	Action Action
	// Template is the copy guestnet writes (Repoint) or would write (WaitForRollout,
	// Reverted, NameTaken); nil with NoAction.
	Template *unstructured.Unstructured
	// Revision is the template revision the copy is declared for.
	Revision string
	// Exists: Template already exists as guestnet writes it (a previous reconcile created it
	// and did not repoint, e.g. it crashed in between): only the repoint is left to do.
	Exists bool
	// RevertedBy names the field managers that own the MachineDeployment's
	// infrastructureRef now (Reverted), sorted; empty when they are not known.
	RevertedBy []string
	// Conflict says why the object holding the copy's name is not guestnet's (NameTaken).
	Conflict string
}

// AppliedRevision is the template revision the MachineDeployment's workers were rolled out
// for: recorded on the MachineDeployment by guestnet's last repoint, else the one its
// template was generated for ("" for a user's template).
func AppliedRevision(md *clusterv1.MachineDeployment, tmpl *unstructured.Unstructured) string {
	if revision, ok := md.Annotations[guestnetv1.TemplateRevisionAnnotation]; ok {
		return revision
	}
	return Revision(tmpl)
}

// RevertedByOthers reports whether the MachineDeployment names the template guestnet last
// repointed it away from. guestnet never points a MachineDeployment back at a template it
// replaced, so only another writer can have done this.
func RevertedByOthers(md *clusterv1.MachineDeployment) bool {
	from := md.Annotations[guestnetv1.RepointedFromAnnotation]
	return from != "" && from == md.Spec.Template.Spec.InfrastructureRef.Name
}

// decide is the pure part of the plan: everything but whether the copy's name is taken.
// Order matters: a revert is never fought, even mid-rollout; a rollout guestnet started is
// waited for; any other rollout (a repoint or edit by someone else, the first rollout of new
// workers) is redirected at once, because every worker it creates would drop the ports.
func decide(w *Workers, cluster, revision string) (Plan, error) {
	if w.TemplateErr != nil || w.TopologyOwned() {
		return Plan{Action: NoAction}, nil
	}
	md := w.MachineDeployment
	switch w.Analysis.State {
	case PortsMissing:
	case PortsDeclared:
		if AppliedRevision(md, w.Template) == revision {
			return Plan{Action: NoAction}, nil
		}
	default:
		return Plan{Action: NoAction}, nil
	}
	tmpl, err := Declare(w.Template, w.Analysis.Missing, cluster, revision)
	if err != nil {
		return Plan{}, err
	}
	p := Plan{Template: tmpl, Revision: revision}
	switch rolling, _, _ := w.RollingOut(); {
	case RevertedByOthers(md):
		p.Action, p.RevertedBy = Reverted, InfrastructureRefOwners(md)
	case rolling && w.Template.GetLabels()[guestnetv1.GeneratedTemplateLabel] == cluster:
		p.Action = WaitForRollout
	default:
		p.Action = Repoint
	}
	return p, nil
}

// planWorkers decides, for a worker MachineDeployment of cluster, what guestnet does (see
// Plan); for a repoint it reads, through host, whether an object holds the copy's name.
func planWorkers(ctx context.Context, host client.Reader, w *Workers, cluster *clusterv1.Cluster) error {
	p, err := decide(w, cluster.Name, cluster.Annotations[guestnetv1.TemplateRevisionAnnotation])
	if err != nil {
		return err
	}
	if p.Action == Repoint {
		existing := &unstructured.Unstructured{}
		existing.SetGroupVersionKind(KubevirtMachineTemplateGVK)
		switch err := host.Get(ctx, client.ObjectKeyFromObject(p.Template), existing); {
		case apierrors.IsNotFound(err):
		case err != nil:
			return err
		default:
			if conflict := Adoptable(existing, p.Template, cluster.Name); conflict != nil {
				p.Action, p.Conflict = NameTaken, conflict.Error()
			} else {
				p.Exists = true
			}
		}
	}
	w.Plan = p
	return nil
}

// SourcePorts says what to declare in the source of the MachineDeployment's template (Git,
// a Helm chart) so that it needs no copy: the interface and its complete ports list, as the
// copy guestnet would write declares them. "" when there is nothing to declare.
func (w *Workers) SourcePorts() string {
	if w.Plan.Template == nil {
		return ""
	}
	iface, list, err := PodInterfacePorts(w.Plan.Template)
	if err != nil || iface == "" {
		return ""
	}
	return fmt.Sprintf("set the ports of interface %s (spec.template.spec.virtualMachineTemplate.spec.template.spec.domain.devices.interfaces) of KubevirtMachineTemplate %s to %s",
		iface, w.Template.GetName(), list)
}

// RevertedByText names who set the MachineDeployment back, for messages.
func (p Plan) RevertedByText() string {
	managers := p.RevertedBy
	switch len(managers) {
	case 0:
		return "another field manager"
	case 1:
		return "field manager " + managers[0]
	}
	return "field managers " + strings.Join(managers, ", ")
}
