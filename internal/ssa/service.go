// Package ssa is how guestnet writes the objects it keeps, in the host and in the guest, typed
// (Services) and unstructured (Cilium's pools and L2 policies, the topology controller's
// objects): server-side apply, and only when the apply would change something. Applying an unchanged configuration changes nothing in the object, but it is
// still a write request, on every reconcile; so the configuration is first compared with
// what guestnet's field manager owns in the live object (the caches keep guestnet's own
// managedFields entry for this, see internal/manager).
package ssa

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// ServiceUpToDate reports whether applying desired to the live Service as guestnet's field
// manager would change nothing: the fields guestnet owns in live are exactly desired's, with
// desired's values.
//
// The answer is remembered for live's UID and resourceVersion (verdicts).
func ServiceUpToDate(desired *corev1ac.ServiceApplyConfiguration, live *corev1.Service) (bool, error) {
	key, remember := serviceVerdicts.key(live.UID, live.ResourceVersion, desired)
	if remember {
		if upToDate, ok := serviceVerdicts.get(key); ok {
			return upToDate, nil
		}
	}
	owned, err := corev1ac.ExtractService(live, ownership.FieldManager)
	if err != nil {
		return false, err
	}
	upToDate := equality.Semantic.DeepEqual(owned, desired)
	if remember {
		serviceVerdicts.put(key, upToDate)
	}
	return upToDate, nil
}

// ApplyService server-side applies desired as guestnet (forcing only the fields it lists)
// and returns the Service the apiserver answered with.
func ApplyService(ctx context.Context, c client.Client, desired *corev1ac.ServiceApplyConfiguration) (*corev1.Service, error) {
	ac := *desired // the client writes the response into the configuration
	if err := c.Apply(ctx, &ac, applyOptions(ownership.FieldManager)...); err != nil {
		return nil, err
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&ac)
	if err != nil {
		return nil, err
	}
	svc := &corev1.Service{}
	return svc, runtime.DefaultUnstructuredConverter.FromUnstructured(u, svc)
}

// EnsureService applies desired unless live (nil when unknown) is up to date with it, and
// returns the Service as it is afterwards.
func EnsureService(ctx context.Context, c client.Client, desired *corev1ac.ServiceApplyConfiguration, live *corev1.Service) (svc *corev1.Service, applied bool, err error) {
	if live != nil {
		upToDate, err := ServiceUpToDate(desired, live)
		if err != nil {
			return nil, false, err
		}
		if upToDate {
			return live, false, nil
		}
	}
	svc, err = ApplyService(ctx, c, desired)
	if err != nil {
		return nil, false, fmt.Errorf("applying Service %s/%s: %w", *desired.Namespace, *desired.Name, err)
	}
	return svc, true, nil
}

// IsNodePortAllocated recognises the apiserver's refusal of a nodePort another Service holds.
func IsNodePortAllocated(err error) bool {
	return apierrors.IsInvalid(err) && strings.Contains(err.Error(), "provided port is already allocated")
}

// APIErrorMessage is the apiserver's message of a status error (its causes for Invalid).
func APIErrorMessage(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Details != nil && len(status.Status().Details.Causes) > 0 {
		var parts []string
		for _, c := range status.Status().Details.Causes {
			parts = append(parts, fmt.Sprintf("%s: %s", c.Field, c.Message))
		}
		return strings.Join(parts, "; ")
	}
	return err.Error()
}
