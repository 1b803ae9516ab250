package ports

import (
	"encoding/json"
	"slices"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// infrastructureRefNamePath is spec.template.spec.infrastructureRef.name of a
// MachineDeployment in managedFields' fieldsV1 notation.
var infrastructureRefNamePath = []string{"f:spec", "f:template", "f:spec", "f:infrastructureRef", "f:name"}

// InfrastructureRefOwners names the field managers, other than guestnet, that own the
// MachineDeployment's spec.template.spec.infrastructureRef.name: who set the template it
// points at (a GitOps tool's manager, e.g. kustomize-controller or argocd-controller;
// kubectl-edit, kubectl-client-side-apply). Sorted, each once.
func InfrastructureRefOwners(md *clusterv1.MachineDeployment) []string {
	var owners []string
	for _, e := range md.ManagedFields {
		if e.Manager != ownership.FieldManager && ownsInfrastructureRefName(e) && !slices.Contains(owners, e.Manager) {
			owners = append(owners, e.Manager)
		}
	}
	slices.Sort(owners)
	return owners
}

func ownsInfrastructureRefName(e metav1.ManagedFieldsEntry) bool {
	if e.FieldsV1 == nil {
		return false
	}
	var fields map[string]any
	if err := json.Unmarshal(e.FieldsV1.GetRawBytes(), &fields); err != nil {
		return false
	}
	for _, key := range infrastructureRefNamePath {
		next, ok := fields[key].(map[string]any)
		if !ok {
			return false
		}
		fields = next
	}
	return true
}

// KeepInfrastructureRefOwners is the cache transform of MachineDeployments: it keeps
// guestnet's own managedFields entries, and of the others only who owns
// spec.template.spec.infrastructureRef.name (trimmed to that field), so that the message
// about a reverted repoint can name the tool (InfrastructureRefOwners) without the cache
// holding every MachineDeployment's managedFields.
func KeepInfrastructureRefOwners(in any) (any, error) {
	obj, err := meta.Accessor(in)
	if err != nil {
		return in, nil //nolint:nilerr // not an object (e.g. a tombstone): nothing to strip
	}
	var keep []metav1.ManagedFieldsEntry
	for _, e := range obj.GetManagedFields() {
		switch {
		case e.Manager == ownership.FieldManager:
			keep = append(keep, e)
		case ownsInfrastructureRefName(e):
			e.FieldsV1 = metav1.NewFieldsV1(string(infrastructureRefNameFields))
			keep = append(keep, e)
		}
	}
	obj.SetManagedFields(keep)
	return in, nil
}

var infrastructureRefNameFields = func() []byte {
	var fields any = map[string]any{}
	for i := len(infrastructureRefNamePath) - 1; i >= 0; i-- {
		fields = map[string]any{infrastructureRefNamePath[i]: fields}
	}
	data, _ := json.Marshal(fields)
	return data
}()
