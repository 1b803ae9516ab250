package ssa

import (
	"context"
	"errors"
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

var serviceKind = schema.GroupKind{Kind: "Service"}

// nodePortAllocated is the apiserver's answer to a Service asking for a nodePort another holds.
func nodePortAllocated() error {
	return apierrors.NewInvalid(serviceKind, "cert-manager-webhook-guestnet-nodeport", field.ErrorList{
		field.Invalid(field.NewPath("spec", "ports").Index(0).Child("nodePort"), int32(32700), "provided port is already allocated"),
	})
}

func TestIsNodePortAllocated(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{name: "no error"},
		{name: "nodePort held by another Service", err: nodePortAllocated(), want: true},
		{name: "wrapped, as EnsureService returns it", err: fmt.Errorf("applying Service a/b: %w", nodePortAllocated()), want: true},
		{
			name: "another invalid field",
			err: apierrors.NewInvalid(serviceKind, "x", field.ErrorList{
				field.Invalid(field.NewPath("spec", "ports").Index(0).Child("nodePort"), int32(80), "provided port is not in the valid range. The range of valid ports is 30000-32767"),
			}),
		},
		{name: "the words in another kind of error", err: apierrors.NewConflict(schema.GroupResource{Resource: "services"}, "x", errors.New("provided port is already allocated"))},
		{name: "the words in a plain error", err: errors.New("provided port is already allocated")},
		{name: "not found", err: apierrors.NewNotFound(schema.GroupResource{Resource: "services"}, "x")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			NewWithT(t).Expect(IsNodePortAllocated(tt.err)).To(Equal(tt.want))
		})
	}
}

func TestAPIErrorMessage(t *testing.T) {
	twoCauses := apierrors.NewInvalid(serviceKind, "x", field.ErrorList{
		field.Invalid(field.NewPath("spec", "ports").Index(0).Child("nodePort"), int32(32700), "provided port is already allocated"),
		field.Required(field.NewPath("spec", "selector"), "a selector is needed"),
	})
	tests := []struct {
		name string
		err  error
		want string
	}{
		{
			name: "the causes of an Invalid error",
			err:  nodePortAllocated(),
			want: "spec.ports[0].nodePort: Invalid value: 32700: provided port is already allocated",
		},
		{
			name: "wrapped",
			err:  fmt.Errorf("applying Service a/b: %w", nodePortAllocated()),
			want: "spec.ports[0].nodePort: Invalid value: 32700: provided port is already allocated",
		},
		{
			name: "several causes",
			err:  twoCauses,
			want: "spec.ports[0].nodePort: Invalid value: 32700: provided port is already allocated; spec.selector: Required value: a selector is needed",
		},
		{
			name: "a status error without causes: its message",
			err:  apierrors.NewForbidden(schema.GroupResource{Resource: "services"}, "x", errors.New("no RBAC")),
			want: `services "x" is forbidden: no RBAC`,
		},
		{name: "not a status error", err: errors.New("connection refused"), want: "connection refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			NewWithT(t).Expect(APIErrorMessage(tt.err)).To(Equal(tt.want))
		})
	}
}

// desired is a NodePort Service as guestnet applies it.
func desired() *corev1ac.ServiceApplyConfiguration {
	return corev1ac.Service("cert-manager-webhook-guestnet-nodeport", "cert-manager").
		WithLabels(map[string]string{ownership.ManagedByLabel: ownership.ManagedByValue}).
		WithSpec(corev1ac.ServiceSpec().WithType(corev1.ServiceTypeNodePort).
			WithSelector(map[string]string{"app": "webhook"}).
			WithPorts(corev1ac.ServicePort().WithName("https").WithProtocol(corev1.ProtocolTCP).
				WithPort(443).WithTargetPort(intstr.FromString("https")).WithNodePort(32700)))
}

// serviceOwnedFields is what the apiserver records for guestnet after applying desired().
const serviceOwnedFields = `{
  "f:metadata": {"f:labels": {"f:app.kubernetes.io/managed-by": {}}},
  "f:spec": {
    "f:ports": {"k:{\"port\":443,\"protocol\":\"TCP\"}": {".": {}, "f:name": {}, "f:nodePort": {}, "f:port": {}, "f:protocol": {}, "f:targetPort": {}}},
    "f:selector": {"f:app": {}},
    "f:type": {}
  }
}`

// live is the Service as the apiserver holds it after guestnet applied desired(), with what
// others (the apiserver's defaults, other managers) added.
func live(manager string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "cert-manager", Name: "cert-manager-webhook-guestnet-nodeport", ResourceVersion: "42",
			Labels:      map[string]string{ownership.ManagedByLabel: ownership.ManagedByValue, "team": "x"},
			Annotations: map[string]string{"note": "someone else's"},
			ManagedFields: []metav1.ManagedFieldsEntry{
				{Manager: manager, Operation: metav1.ManagedFieldsOperationApply, APIVersion: "v1", FieldsType: "FieldsV1",
					FieldsV1: metav1.NewFieldsV1(serviceOwnedFields)},
				{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", FieldsType: "FieldsV1",
					FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{"f:team":{}},"f:annotations":{"f:note":{}}}}`)},
			},
		},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeNodePort,
			Selector:  map[string]string{"app": "webhook"},
			ClusterIP: "10.96.7.7", ClusterIPs: []string{"10.96.7.7"},
			Ports: []corev1.ServicePort{{
				Name: "https", Protocol: corev1.ProtocolTCP, Port: 443, TargetPort: intstr.FromString("https"), NodePort: 32700,
			}},
			SessionAffinity:       corev1.ServiceAffinityNone,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster,
		},
	}
}

func TestServiceUpToDate(t *testing.T) {
	tests := []struct {
		name    string
		desired *corev1ac.ServiceApplyConfiguration
		live    *corev1.Service
		want    bool
	}{
		{name: "as applied, whatever others added", desired: desired(), live: live(ownership.FieldManager), want: true},
		{
			name:    "another nodePort wanted",
			desired: desired(),
			live: func() *corev1.Service {
				s := live(ownership.FieldManager)
				s.Spec.Ports[0].NodePort = 32701
				return s
			}(),
		},
		{
			name: "a field guestnet no longer wants (it must be removed by an apply)",
			desired: corev1ac.Service("cert-manager-webhook-guestnet-nodeport", "cert-manager").
				WithLabels(map[string]string{ownership.ManagedByLabel: ownership.ManagedByValue}).
				WithSpec(corev1ac.ServiceSpec().WithType(corev1.ServiceTypeNodePort).WithSelector(map[string]string{"app": "webhook"})),
			live: live(ownership.FieldManager),
		},
		{
			// A Service an older guestnet applied gets a selector key the new one adds (the
			// KubevirtMachines' namespace of virtlauncher.WorkerSelector) by an apply.
			name: "a selector key guestnet now wants too",
			desired: func() *corev1ac.ServiceApplyConfiguration {
				d := desired()
				d.Spec.WithSelector(map[string]string{"capk.cluster.x-k8s.io/kubevirt-machine-namespace": "k0smotron"})
				return d
			}(),
			live: live(ownership.FieldManager),
		},
		{name: "applied by another manager", desired: desired(), live: live("helm")},
		{
			name:    "someone changed a value guestnet owns",
			desired: desired(),
			live: func() *corev1.Service {
				s := live(ownership.FieldManager)
				s.Spec.Selector["app"] = "other"
				return s
			}(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			got, err := ServiceUpToDate(tt.desired, tt.live)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tt.want))
		})
	}
}

// An up-to-date Service is not written: no client call at all (the client here is nil).
func TestEnsureServiceUpToDate(t *testing.T) {
	g := NewWithT(t)
	l := live(ownership.FieldManager)
	svc, applied, err := EnsureService(context.Background(), nil, desired(), l)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(applied).To(BeFalse())
	g.Expect(svc).To(BeIdenticalTo(l))
}
