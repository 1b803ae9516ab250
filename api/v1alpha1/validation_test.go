package v1alpha1_test

// Server-side validation of the guestnet API: every case creates an object in a REAL
// kube-apiserver (the lab's host control plane, with config/crd/bases installed) and checks
// that it is accepted, or rejected with a message that names the mistake. A rejection is only
// counted when its message carries the expected fragment, so weakening or removing a marker
// makes a case fail.
//
// Objects are written as unstructured YAML (what kubectl users send, with kubectl's strict
// field validation), plus a few typed objects (what the controllers and Go users send).
//
// Run with: make test TEST_PKGS=./api/... TEST_ARGS='-run TestValidation -v'

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	corev1 "k8s.io/api/core/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

// --- one lab per test binary ------------------------------------------------------------

// One lab per test binary, host control plane only.
var shared = lab.Shared{Options: lab.Options{SkipGuest: true}, DirPrefix: "guestnet-api-validation"}

func TestMain(m *testing.M) { shared.Main(m) }

// hostLab returns the shared lab; it skips the test outside the lab namespace.
func hostLab(t *testing.T) *lab.Lab { return shared.Get(t) }

// testNamespace creates a namespace for one test function.
func testNamespace(t *testing.T, c client.Client, name string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	return name
}

// --- the cases ------------------------------------------------------------------------------

// specCase is one spec a user may write: the base spec with patch merged in (JSON merge
// patch semantics: maps merge, lists and scalars replace, null deletes). want is "" when the
// apiserver must accept the object, or a fragment of the rejection message.
type specCase struct {
	intent string
	patch  string
	want   string
}

const giBase = `
clusterName: tenant-a
guestService: {namespace: projectcontour, name: envoy}
loadBalancer: {ip: 10.2.6.220}
`

func TestValidationGuestIngress(t *testing.T) {
	cases := []specCase{
		// clusterName
		{"minimal spec accepted", `{}`, ""},
		{"missing clusterName rejected", `{clusterName: null}`, `spec.clusterName: Required value`},
		{"empty clusterName rejected", `{clusterName: ""}`, `spec.clusterName in body should be at least 1 chars long`},
		{"clusterName over 63 characters rejected", `{clusterName: ` + strings.Repeat("c", 64) + `}`, `spec.clusterName: Too long: may not be more than 63`},
		{"upper-case clusterName rejected", `{clusterName: Tenant-A}`, `clusterName must be the name of a Cluster in this namespace`},
		{"namespace-qualified clusterName rejected", `{clusterName: k0smotron/tenant-a}`, `clusterName must be the name of a Cluster in this namespace`},
		{"dotted clusterName accepted", `{clusterName: tenant-a.prod}`, ""},

		// guestService
		{"missing guestService rejected", `{guestService: null}`, `spec.guestService: Required value`},
		{"missing guestService namespace rejected", `{guestService: {namespace: null}}`, `spec.guestService.namespace: Required value`},
		{"missing guestService name rejected", `{guestService: {name: null}}`, `spec.guestService.name: Required value`},
		{"empty guestService name rejected", `{guestService: {name: ""}}`, `spec.guestService.name in body should be at least 1 chars long`},
		{"upper-case guestService namespace rejected", `{guestService: {namespace: ProjectContour}}`, `spec.guestService.namespace in body should match`},
		{"guestService namespace/name in one field rejected", `{guestService: {name: projectcontour/envoy}}`, `spec.guestService.name in body should match`},
		{"dotted guestService name rejected", `{guestService: {name: envoy.projectcontour}}`, `spec.guestService.name in body should match`},
		{"guestService name ending in a dash rejected", `{guestService: {name: envoy-}}`, `spec.guestService.name in body should match`},
		{"guestService name over 63 characters rejected", `{guestService: {name: ` + strings.Repeat("e", 64) + `}}`, `spec.guestService.name: Too long: may not be more than 63`},

		// ports
		{"explicit ports accepted", `{ports: [{name: http, port: 80, nodePort: 30080}, {name: https, port: 443, nodePort: 30443}]}`, ""},
		{"empty ports list rejected", `{ports: []}`, `spec.ports in body should have at least 1 items`},
		{"port 0 rejected", `{ports: [{name: http, port: 0}]}`, `spec.ports[0].port in body should be greater than or equal to 1`},
		{"port 65536 rejected", `{ports: [{name: http, port: 65536}]}`, `spec.ports[0].port in body should be less than or equal to 65535`},
		{"port without number rejected", `{ports: [{name: http}]}`, `spec.ports[0].port: Required value`},
		{"port without name rejected", `{ports: [{port: 80}]}`, `spec.ports[0].name: Required value`},
		{"nodePort 29999 rejected", `{ports: [{name: http, port: 80, nodePort: 29999}]}`, `spec.ports[0].nodePort in body should be greater than or equal to 30000`},
		{"nodePort 32768 rejected", `{ports: [{name: http, port: 80, nodePort: 32768}]}`, `spec.ports[0].nodePort in body should be less than or equal to 32767`},
		{"nodePort 30000 and 32767 accepted", `{ports: [{name: low, port: 80, nodePort: 30000}, {name: high, port: 443, nodePort: 32767}]}`, ""},
		{"upper-case port name rejected", `{ports: [{name: HTTP, port: 80}]}`, `spec.ports[0].name in body should match`},
		{"numeric port name rejected", `{ports: [{name: "443", port: 443}]}`, `spec.ports[0].name: Invalid value: "443": port name must be an IANA service name`},
		{"port name with -- rejected", `{ports: [{name: http--alt, port: 8080}]}`, `port name must be an IANA service name`},
		{"port names with digits accepted", `{ports: [{name: h2c, port: 8080}, {name: http-8443, port: 8443}]}`, ""},
		{"port name over 15 characters rejected", `{ports: [{name: http-alternative, port: 8080}]}`, `spec.ports[0].name: Too long: may not be more than 15`},
		{"duplicate port names rejected", `{ports: [{name: http, port: 80}, {name: http, port: 8080}]}`, `spec.ports[1]: Duplicate value`},
		{"duplicate nodePorts rejected", `{ports: [{name: http, port: 80, nodePort: 30080}, {name: alt, port: 8080, nodePort: 30080}]}`, `each nodePort may be used by one port per protocol only`},
		{"one nodePort for TCP and UDP accepted (HTTP/3)", `{ports: [{name: https, port: 443, nodePort: 30443}, {name: quic, port: 443, protocol: UDP, nodePort: 30443}]}`, ""},
		{"same port and protocol twice rejected", `{ports: [{name: http, port: 80, protocol: TCP}, {name: web, port: 80, protocol: TCP}]}`, `each port/protocol pair may be listed once only`},
		{"same port twice with the defaulted protocol rejected", `{ports: [{name: http, port: 80}, {name: web, port: 80, protocol: TCP}]}`, `each port/protocol pair may be listed once only`},
		{"same port with TCP and UDP accepted", `{ports: [{name: https, port: 443, protocol: TCP}, {name: quic, port: 443, protocol: UDP}]}`, ""},
		{"protocol SCTP rejected", `{ports: [{name: http, port: 80, protocol: SCTP}]}`, `spec.ports[0].protocol: Unsupported value: "SCTP"`},
		{"lower-case protocol rejected", `{ports: [{name: http, port: 80, protocol: tcp}]}`, `spec.ports[0].protocol: Unsupported value: "tcp"`},
		{"16 ports accepted", `{ports: ` + ports(16) + `}`, ""},
		{"17 ports rejected", `{ports: ` + ports(17) + `}`, `spec.ports: Too many: 17: must have at most 16 items`},

		// loadBalancer: where the IP comes from
		{"missing loadBalancer rejected", `{loadBalancer: null}`, `spec.loadBalancer: Required value`},
		{"loadBalancer with none of ip/cidrs/poolRef rejected", `{loadBalancer: {ip: null, class: io.cilium/l2-announcer}}`, `loadBalancer needs ip, ips, cidrs or poolRef`},
		{"invalid IPv4 octet rejected", `{loadBalancer: {ip: 10.2.6.300}}`, `ip must be an IPv4 or IPv6 address`},
		{"ip that is no address rejected", `{loadBalancer: {ip: not-an-ip}}`, `ip must be an IPv4 or IPv6 address`},
		{"ip with a prefix length rejected", `{loadBalancer: {ip: 10.2.6.220/32}}`, `ip must be an IPv4 or IPv6 address`},
		{"empty ip rejected", `{loadBalancer: {ip: ""}}`, `ip must be an IPv4 or IPv6 address`},
		{"IPv6 ip accepted", `{loadBalancer: {ip: "2001:db8::10"}}`, ""},
		{"cidrs alone accepted", `{loadBalancer: {ip: null, cidrs: [10.2.6.220/29]}}`, ""},
		{"invalid cidr rejected", `{loadBalancer: {ip: null, cidrs: [10.2.6.0/33]}}`, `each cidr must be a CIDR such as 10.2.6.220/29`},
		{"cidr without prefix length rejected", `{loadBalancer: {ip: null, cidrs: [10.2.6.220]}}`, `each cidr must be a CIDR such as 10.2.6.220/29`},
		{"duplicate cidrs rejected", `{loadBalancer: {ip: null, cidrs: [10.2.6.220/29, 10.2.6.220/29]}}`, `spec.loadBalancer.cidrs[1]: Duplicate value`},
		{"empty cidrs list rejected", `{loadBalancer: {ip: null, cidrs: []}}`, `spec.loadBalancer.cidrs in body should have at least 1 items`},
		{"9 cidrs rejected", `{loadBalancer: {ip: null, cidrs: ` + cidrs(9) + `}}`, `spec.loadBalancer.cidrs: Too many: 9: must have at most 8 items`},
		{"ip inside cidrs accepted", `{loadBalancer: {ip: 10.2.6.221, cidrs: [10.2.6.220/29]}}`, ""},
		{"ip inside the second cidr accepted", `{loadBalancer: {ip: 10.2.8.1, cidrs: [10.2.6.220/29, 10.2.8.0/30]}}`, ""},
		{"ip outside cidrs rejected", `{loadBalancer: {ip: 10.2.7.1, cidrs: [10.2.6.220/29]}}`, `loadBalancer.ip must be inside one of loadBalancer.cidrs`},
		{"IPv6 ip inside IPv6 cidr accepted", `{loadBalancer: {ip: "2001:db8::10", cidrs: ["2001:db8::/120"]}}`, ""},
		{"IPv6 ip with IPv4 cidrs rejected", `{loadBalancer: {ip: "2001:db8::10", cidrs: [10.2.6.220/29]}}`, `loadBalancer.ip must be inside one of loadBalancer.cidrs`},
		{"invalid ip with cidrs reports the bad ip", `{loadBalancer: {ip: 10.2.6.300, cidrs: [10.2.6.220/29]}}`, `ip must be an IPv4 or IPv6 address`},
		{"invalid cidr with ip reports the bad cidr", `{loadBalancer: {ip: 10.2.6.221, cidrs: [10.2.6.220/29, 10.2.6.0/33]}}`, `spec.loadBalancer.cidrs[1]: Invalid value: "10.2.6.0/33": each cidr must be a CIDR`},
		{"poolRef alone accepted", `{loadBalancer: {ip: null, poolRef: {name: shared-pool}}}`, ""},
		{"ip with poolRef accepted", `{loadBalancer: {poolRef: {name: shared-pool}}}`, ""},
		{"poolRef without name rejected", `{loadBalancer: {poolRef: {}}}`, `spec.loadBalancer.poolRef.name: Required value`},
		{"cidrs and poolRef together rejected", `{loadBalancer: {cidrs: [10.2.6.220/29], poolRef: {name: shared-pool}}}`, `loadBalancer.cidrs and loadBalancer.poolRef are mutually exclusive`},

		// loadBalancer: the host Service and the announcement
		{"externalTrafficPolicy Local with a BGP class accepted", `{loadBalancer: {externalTrafficPolicy: Local, class: io.cilium/bgp-control-plane}}`, ""},
		{"externalTrafficPolicy Local with Cilium's L2 announcer (the default class) rejected", `{loadBalancer: {externalTrafficPolicy: Local}}`, `externalTrafficPolicy Local does not work with Cilium's L2 announcer`},
		{"externalTrafficPolicy Local with MetalLB's class accepted", `{loadBalancer: {externalTrafficPolicy: Local, class: metallb.io/metallb}}`, ""},

		// loadBalancer: IP families
		{"dual-stack ips accepted", `{loadBalancer: {ip: null, ips: [10.2.6.220, "2001:db8:6::220"]}}`, ""},
		{"IPv6 first accepted", `{loadBalancer: {ip: null, ips: ["2001:db8:6::220", 10.2.6.220]}}`, ""},
		{"ips inside cidrs accepted", `{loadBalancer: {ip: null, ips: [10.2.6.221, "2001:db8:6::2"], cidrs: [10.2.6.220/29, "2001:db8:6::/125"]}}`, ""},
		{"an IPv6 of ips outside cidrs rejected", `{loadBalancer: {ip: null, ips: [10.2.6.221, "2001:db8:7::2"], cidrs: [10.2.6.220/29, "2001:db8:6::/125"]}}`, `each of loadBalancer.ips must be inside one of loadBalancer.cidrs`},
		{"two ips of one family rejected", `{loadBalancer: {ip: null, ips: [10.2.6.220, 10.2.6.221]}}`, `loadBalancer.ips holds at most one address per IP family`},
		{"three ips rejected", `{loadBalancer: {ip: null, ips: [10.2.6.220, "2001:db8:6::220", 10.2.6.221]}}`, `spec.loadBalancer.ips: Too many: 3: must have at most 2 items`},
		{"ips that are no addresses rejected", `{loadBalancer: {ip: null, ips: [not-an-ip]}}`, `each of ips must be an IPv4 or IPv6 address`},
		{"ip and ips together rejected", `{loadBalancer: {ips: ["2001:db8:6::220"]}}`, `loadBalancer.ip and loadBalancer.ips are mutually exclusive`},
		{"ipFamilies with cidrs of both families accepted", `{loadBalancer: {ip: null, cidrs: [10.2.6.0/29, "2001:db8:6::/125"], ipFamilies: [IPv6, IPv4]}}`, ""},
		{"the same family twice rejected", `{loadBalancer: {ipFamilies: [IPv4, IPv4]}}`, `loadBalancer.ipFamilies lists each family once`},
		{"an unknown family rejected", `{loadBalancer: {ipFamilies: [ipv4]}}`, `spec.loadBalancer.ipFamilies[0]: Unsupported value: "ipv4"`},

		// loadBalancer: BGP
		{"BGP communities accepted", `{loadBalancer: {class: io.cilium/bgp-control-plane, bgp: {communities: {standard: ["65000:100", "4259840100"], wellKnown: [no-export], large: ["64512:1:100"]}, advertisementLabels: {upstream: transit}}}}`, ""},
		{"a well-known community Cilium does not name rejected", `{loadBalancer: {bgp: {communities: {wellKnown: [no-such]}}}}`, `spec.loadBalancer.bgp.communities.wellKnown[0]: Unsupported value: "no-such"`},
		{"a standard community of three parts rejected", `{loadBalancer: {bgp: {communities: {standard: ["1:2:3"]}}}}`, `spec.loadBalancer.bgp.communities.standard[0] in body should match`},
		{"a large community of two parts rejected", `{loadBalancer: {bgp: {communities: {large: ["1:2"]}}}}`, `spec.loadBalancer.bgp.communities.large[0] in body should match`},
		{"unknown externalTrafficPolicy rejected", `{loadBalancer: {externalTrafficPolicy: local}}`, `spec.loadBalancer.externalTrafficPolicy: Unsupported value: "local"`},
		{"empty class rejected", `{loadBalancer: {class: ""}}`, `spec.loadBalancer.class in body should be at least 1 chars long`},
		{"another class accepted", `{loadBalancer: {class: metallb.io/metallb}}`, ""},
		{"l2 interfaces and nodeSelector accepted", `{loadBalancer: {l2: {interfaces: ["^eth0$"], nodeSelector: {matchLabels: {node-role.kubernetes.io/worker: ""}}}}}`, ""},
		{"empty l2 interface rejected", `{loadBalancer: {l2: {interfaces: [""]}}}`, `spec.loadBalancer.l2.interfaces[0] in body should be at least 1 chars long`},
		{"annotations and labels accepted", `{loadBalancer: {annotations: {a.example.com/b: c}, labels: {team: web}}}`, ""},
		{"empty label value accepted", `{loadBalancer: {labels: {example.com/edge: ""}}}`, ""},
		{"label key with a space rejected", `{loadBalancer: {labels: {"bad key": web}}}`, `each key of loadBalancer.labels must be a qualified name`},
		{"label key with two slashes rejected", `{loadBalancer: {labels: {"a.example.com/b/c": web}}}`, `each key of loadBalancer.labels must be a qualified name`},
		{"label key prefix that is no DNS subdomain rejected", `{loadBalancer: {labels: {"Example.com/tier": web}}}`, `each key of loadBalancer.labels must be a qualified name`},
		{"label key name over 63 characters rejected", `{loadBalancer: {labels: {"example.com/` + strings.Repeat("n", 64) + `": web}}}`, `each key of loadBalancer.labels must be a qualified name`},
		{"label value over 63 characters rejected", `{loadBalancer: {labels: {team: ` + strings.Repeat("v", 64) + `}}}`, `each value of loadBalancer.labels must be a label value`},
		{"label value with a space accepted at admission", `{loadBalancer: {labels: {team: "web edge"}}}`, ""}, // checked when the host Service is built (InvalidSpec)
		{"33 labels rejected", `{loadBalancer: {labels: ` + stringMap(33) + `}}`, `spec.loadBalancer.labels: Too many: 33: must have at most 32 items`},
		{"annotation key with a space rejected", `{loadBalancer: {annotations: {"bad key": x}}}`, `each key of loadBalancer.annotations must be a qualified name`},
		{"annotation key prefix over 253 characters rejected", `{loadBalancer: {annotations: {"` + strings.Repeat(strings.Repeat("a", 60)+".", 5) + `com/x": v}}}`, `each key of loadBalancer.annotations must be a qualified name`},
		{"annotation value with spaces and JSON accepted", `{loadBalancer: {annotations: {example.com/config: '{"a": "b c"}'}}}`, ""},
		{"annotation value over 4096 characters rejected", `{loadBalancer: {annotations: {example.com/x: ` + strings.Repeat("v", 4097) + `}}}`, `each value of loadBalancer.annotations may be at most 4096 characters long`},
		{"33 annotations rejected", `{loadBalancer: {annotations: ` + stringMap(33) + `}}`, `spec.loadBalancer.annotations: Too many: 33: must have at most 32 items`},
		{"class that is no qualified name rejected", `{loadBalancer: {class: "my class"}}`, `class must be a qualified name`},
		{"class with a name part over 63 characters rejected", `{loadBalancer: {class: example.com/` + strings.Repeat("c", 64) + `}}`, `class must be a qualified name`},
		{"class without a prefix accepted", `{loadBalancer: {class: internal-lb}}`, ""},
		{"nodeSelector with an unknown operator rejected", `{loadBalancer: {l2: {nodeSelector: {matchExpressions: [{key: zone, operator: Equals, values: [a]}]}}}}`, `each operator of l2.nodeSelector.matchExpressions must be In, NotIn, Exists or DoesNotExist`},
		{"nodeSelector In without values rejected", `{loadBalancer: {l2: {nodeSelector: {matchExpressions: [{key: zone, operator: In}]}}}}`, `In and NotIn need values, Exists and DoesNotExist take none`},
		{"nodeSelector Exists with values rejected", `{loadBalancer: {l2: {nodeSelector: {matchExpressions: [{key: zone, operator: Exists, values: [a]}]}}}}`, `In and NotIn need values, Exists and DoesNotExist take none`},
		{"nodeSelector with every operator accepted", `{loadBalancer: {l2: {nodeSelector: {matchExpressions: [{key: a, operator: In, values: [x]}, {key: b, operator: NotIn, values: [other]}, {key: c, operator: Exists}, {key: example.com/d, operator: DoesNotExist}]}}}}`, ""},
		{"nodeSelector with 17 expressions rejected", `{loadBalancer: {l2: {nodeSelector: {matchExpressions: ` + expressions(17) + `}}}}`, `l2.nodeSelector may have at most 16 matchLabels, 16 matchExpressions and 16 values per expression`},

		// declarePorts and typos
		{"declarePorts false accepted", `{declarePorts: false}`, ""},
		{"declarePorts as a string rejected", `{declarePorts: "yes"}`, `spec.declarePorts: Invalid value: "string": spec.declarePorts in body must be of type boolean`},
		{"misspelt field rejected (strict field validation, as kubectl)", `{declarePort: false}`, `unknown field "spec.declarePort"`},
	}
	runSpecCases(t, "GuestIngress", "gi-validation", giBase, cases)
}

const gwbBase = `
clusterName: tenant-a
apiServices: {names: [v1beta1.metrics.k8s.io]}
`

func TestValidationGuestWebhookBridge(t *testing.T) {
	cases := []specCase{
		// clusterName
		{"minimal spec accepted", `{}`, ""},
		{"missing clusterName rejected", `{clusterName: null}`, `spec.clusterName: Required value`},
		{"empty clusterName rejected", `{clusterName: ""}`, `spec.clusterName in body should be at least 1 chars long`},
		{"namespace-qualified clusterName rejected", `{clusterName: k0smotron/tenant-a}`, `clusterName must be the name of a Cluster in this namespace`},

		// which targets
		{"no target kind selected rejected", `{apiServices: null}`, `select at least one of apiServices, validatingWebhooks, mutatingWebhooks`},
		{"empty apiServices selector rejected", `{apiServices: {names: null}}`, `spec.apiServices: Invalid value: give names, a selector, or all: true`},
		{"empty names list rejected", `{apiServices: {names: []}}`, `give names, a selector, or all: true`},
		{"all: false alone rejected", `{apiServices: {names: null, all: false}}`, `give names, a selector, or all: true`},
		{"empty validatingWebhooks selector rejected", `{validatingWebhooks: {}}`, `spec.validatingWebhooks: Invalid value: give names, a selector, or all: true`},
		{"empty mutatingWebhooks selector rejected", `{mutatingWebhooks: {}}`, `spec.mutatingWebhooks: Invalid value: give names, a selector, or all: true`},
		{"validatingWebhooks by name accepted", `{apiServices: null, validatingWebhooks: {names: [cert-manager-webhook]}}`, ""},
		{"mutatingWebhooks by selector accepted", `{apiServices: null, mutatingWebhooks: {selector: {matchLabels: {app.kubernetes.io/instance: kyverno}}}}`, ""},
		{"apiServices all accepted", `{apiServices: {names: null, all: true}}`, ""},
		{"all three kinds accepted", `{validatingWebhooks: {all: true}, mutatingWebhooks: {names: [cert-manager-webhook]}}`, ""},
		{"duplicate names rejected", `{apiServices: {names: [v1beta1.metrics.k8s.io, v1beta1.metrics.k8s.io]}}`, `spec.apiServices.names[1]: Duplicate value`},
		{"APIService named <group>/<version> rejected", `{apiServices: {names: [metrics.k8s.io/v1beta1]}}`, `spec.apiServices.names[0]: Invalid value: "metrics.k8s.io/v1beta1": each name must be the name of a guest object`},
		{"upper-case webhook configuration name rejected", `{apiServices: null, validatingWebhooks: {names: [Cert-Manager-Webhook]}}`, `spec.validatingWebhooks.names[0]: Invalid value: "Cert-Manager-Webhook": each name must be the name of a guest object`},
		{"mutating webhook configuration named <namespace>/<name> rejected", `{mutatingWebhooks: {names: [kyverno/kyverno-resource-mutating-webhook-cfg]}}`, `spec.mutatingWebhooks.names[0]: Invalid value: "kyverno/kyverno-resource-mutating-webhook-cfg": each name must be the name of a guest object`},
		{"empty name rejected", `{apiServices: {names: [""]}}`, `spec.apiServices.names[0] in body should be at least 1 chars long`},
		{"65 names rejected", `{apiServices: {names: ` + names(65) + `}}`, `spec.apiServices.names: Too many: 65: must have at most 64 items`},

		// selector: a label selector the controller can use, checked at admission
		{"selector with matchLabels and matchExpressions accepted", `{apiServices: {names: null, selector: {matchLabels: {app.kubernetes.io/name: metrics-server, tier: ""}, matchExpressions: [{key: example.com/team, operator: In, values: [a, b]}, {key: legacy, operator: DoesNotExist}]}}}`, ""},
		{"matchLabels key with a space rejected", `{apiServices: {names: null, selector: {matchLabels: {"app name": x}}}}`, `each matchLabels key must be a label key`},
		{"matchLabels key with two slashes rejected", `{apiServices: {names: null, selector: {matchLabels: {"a/b/c": x}}}}`, `each matchLabels key must be a label key`},
		{"matchLabels key name of 64 characters rejected", `{apiServices: {names: null, selector: {matchLabels: {` + strings.Repeat("k", 64) + `: x}}}}`, `each matchLabels key must be a label key`},
		{"matchLabels value with a slash rejected", `{apiServices: {names: null, selector: {matchLabels: {app: "cert-manager/webhook"}}}}`, `each matchLabels value must be a label value`},
		{"matchLabels value of 64 characters rejected", `{apiServices: {names: null, selector: {matchLabels: {app: ` + strings.Repeat("v", 64) + `}}}}`, `spec.apiServices.selector.matchLabels.app: Too long: may not be more than 63 bytes`},
		{"33 matchLabels rejected", `{apiServices: {names: null, selector: {matchLabels: ` + labels(33) + `}}}`, `spec.apiServices.selector.matchLabels: Too many: 33: must have at most 32 items`},
		{"unknown operator rejected", `{apiServices: {names: null, selector: {matchExpressions: [{key: app, operator: Equals, values: [x]}]}}}`, `spec.apiServices.selector.matchExpressions[0].operator: Unsupported value: "Equals"`},
		{"In without values rejected", `{validatingWebhooks: {selector: {matchExpressions: [{key: app, operator: In}]}}}`, `operators In and NotIn need values; Exists and DoesNotExist take none`},
		{"Exists with values rejected", `{mutatingWebhooks: {selector: {matchExpressions: [{key: app, operator: Exists, values: [x]}]}}}`, `operators In and NotIn need values; Exists and DoesNotExist take none`},
		{"expression key with a space rejected", `{apiServices: {names: null, selector: {matchExpressions: [{key: "app name", operator: Exists}]}}}`, `key must be a label key`},
		{"expression value with a space rejected", `{apiServices: {names: null, selector: {matchExpressions: [{key: app, operator: In, values: ["a b"]}]}}}`, `each value must be a label value`},
		{"expression value of 64 characters rejected", `{apiServices: {names: null, selector: {matchExpressions: [{key: app, operator: NotIn, values: [` + strings.Repeat("v", 64) + `]}]}}}`, `Too long: may not be more than 63 bytes`},
		{"17 matchExpressions rejected", `{apiServices: {names: null, selector: {matchExpressions: ` + expressions(17) + `}}}`, `spec.apiServices.selector.matchExpressions: Too many: 17: must have at most 16 items`},
		{"unknown selector field rejected", `{apiServices: {names: null, selector: {matchLabel: {app: x}}}}`, `unknown field "spec.apiServices.selector.matchLabel"`},

		// nodePortRange
		{"nodePortRange inside the nodePort range accepted", `{nodePortRange: {start: 30100, size: 8}}`, ""},
		{"nodePortRange ending exactly at 32767 accepted", `{nodePortRange: {start: 32752, size: 16}}`, ""},
		{"nodePortRange start 29999 rejected", `{nodePortRange: {start: 29999, size: 16}}`, `spec.nodePortRange.start in body should be greater than or equal to 30000`},
		{"nodePortRange start 32768 rejected", `{nodePortRange: {start: 32768, size: 1}}`, `spec.nodePortRange.start in body should be less than or equal to 32767`},
		{"nodePortRange ending above 32767 rejected", `{nodePortRange: {start: 32760, size: 16}}`, `nodePortRange must end at or below 32767`},
		{"nodePortRange size 0 rejected", `{nodePortRange: {start: 32700, size: 0}}`, `spec.nodePortRange.size in body should be greater than or equal to 1`},
		{"nodePortRange size 65 rejected", `{nodePortRange: {start: 30000, size: 65}}`, `spec.nodePortRange.size in body should be less than or equal to 64`},
		{"nodePortRange without size rejected", `{nodePortRange: {start: 32700}}`, `spec.nodePortRange.size: Required value`},
		{"nodePortRange without start rejected", `{nodePortRange: {size: 16}}`, `spec.nodePortRange.start: Required value`},

		// mode
		{"mode Always accepted", `{mode: Always}`, ""},
		{"mode Auto accepted", `{mode: Auto}`, ""},
		{"lower-case mode rejected", `{mode: always}`, `spec.mode: Unsupported value: "always"`},
		{"unknown mode rejected", `{mode: Never}`, `spec.mode: Unsupported value: "Never"`},
		{"misspelt field rejected (strict field validation, as kubectl)", `{apiService: {all: true}}`, `unknown field "spec.apiService"`},
	}
	runSpecCases(t, "GuestWebhookBridge", "gwb-validation", gwbBase, cases)
}

// runSpecCases creates one object per case in its own name and checks the outcome.
func runSpecCases(t *testing.T, kind, namespace, base string, cases []specCase) {
	l := hostLab(t)
	c := l.Host.Client
	ns := testNamespace(t, c, namespace)
	for i, tc := range cases {
		t.Run(tc.intent, func(t *testing.T) {
			g := NewWithT(t)
			spec := mergeYAML(t, base, tc.patch)
			obj := newObject(kind, ns, fmt.Sprintf("case-%03d", i), spec)
			err := c.Create(context.Background(), obj, client.FieldValidation("Strict"))
			if tc.want == "" {
				g.Expect(err).NotTo(HaveOccurred(), "spec:\n%s", toYAML(spec))
				return
			}
			g.Expect(err).To(HaveOccurred(), "the apiserver accepted it; expected a rejection containing %q; spec:\n%s", tc.want, toYAML(spec))
			g.Expect(apierrors.IsInvalid(err) || apierrors.IsBadRequest(err)).To(BeTrue(), "unexpected kind of error: %v", err)
			g.Expect(err.Error()).To(ContainSubstring(tc.want))
			// A user must never see a CEL runtime error instead of the rule's message.
			g.Expect(err.Error()).NotTo(Or(ContainSubstring("no such overload"), ContainSubstring("no such key"),
				ContainSubstring("evaluation error"), ContainSubstring("cost")))
			t.Logf("rejected as expected: %v", err)
		})
	}
}

// --- defaults ---------------------------------------------------------------------------

func TestValidationGuestIngressDefaults(t *testing.T) {
	c := hostLab(t).Host.Client
	ns := testNamespace(t, c, "gi-defaults")
	ctx := context.Background()

	t.Run("defaults applied when omitted", func(t *testing.T) {
		g := NewWithT(t)
		obj := newObject("GuestIngress", ns, "omitted", mergeYAML(t, giBase, `{}`))
		g.Expect(c.Create(ctx, obj, client.FieldValidation("Strict"))).To(Succeed())

		gi := &guestnetv1.GuestIngress{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(obj), gi)).To(Succeed())
		g.Expect(gi.Spec.Ports).To(Equal([]guestnetv1.IngressPort{
			{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP},
			{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP},
		}))
		g.Expect(gi.Spec.LoadBalancer.Class).To(Equal(guestnetv1.DefaultLoadBalancerClass))
		g.Expect(gi.Spec.LoadBalancer.Class).To(Equal("io.cilium/l2-announcer"))
		g.Expect(gi.Spec.LoadBalancer.ExternalTrafficPolicy).To(Equal(corev1.ServiceExternalTrafficPolicyCluster))
		g.Expect(gi.Spec.DeclarePorts).To(Equal(ptr.To(true)))
	})

	t.Run("protocol defaulted on each given port", func(t *testing.T) {
		g := NewWithT(t)
		obj := newObject("GuestIngress", ns, "protocol", mergeYAML(t, giBase, `{ports: [{name: http, port: 80, nodePort: 30080}]}`))
		g.Expect(c.Create(ctx, obj)).To(Succeed())
		gi := &guestnetv1.GuestIngress{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(obj), gi)).To(Succeed())
		g.Expect(gi.Spec.Ports).To(Equal([]guestnetv1.IngressPort{
			{Name: "http", Port: 80, NodePort: ptr.To[int32](30080), Protocol: corev1.ProtocolTCP},
		}))
	})

	t.Run("explicit values kept", func(t *testing.T) {
		g := NewWithT(t)
		obj := newObject("GuestIngress", ns, "explicit", mergeYAML(t, giBase,
			`{declarePorts: false, loadBalancer: {class: metallb.io/metallb, externalTrafficPolicy: Local}}`))
		g.Expect(c.Create(ctx, obj)).To(Succeed())
		gi := &guestnetv1.GuestIngress{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(obj), gi)).To(Succeed())
		g.Expect(gi.Spec.DeclarePorts).To(Equal(ptr.To(false)))
		g.Expect(gi.Spec.LoadBalancer.Class).To(Equal("metallb.io/metallb"))
		g.Expect(gi.Spec.LoadBalancer.ExternalTrafficPolicy).To(Equal(corev1.ServiceExternalTrafficPolicyLocal))
	})

	// What the controllers and Go users send: zero values of the Go types must not be
	// rejected and must be defaulted like omitted fields.
	t.Run("typed Go object with only the required fields accepted and defaulted", func(t *testing.T) {
		g := NewWithT(t)
		gi := &guestnetv1.GuestIngress{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "typed"},
			Spec: guestnetv1.GuestIngressSpec{
				ClusterName:  "tenant-a",
				GuestService: guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"},
				LoadBalancer: guestnetv1.LoadBalancerSpec{IP: "10.2.6.220"},
			},
		}
		g.Expect(c.Create(ctx, gi)).To(Succeed())
		g.Expect(gi.Spec.Ports).To(HaveLen(2))
		g.Expect(gi.Spec.LoadBalancer.Class).To(Equal(guestnetv1.DefaultLoadBalancerClass))
		g.Expect(gi.Spec.LoadBalancer.ExternalTrafficPolicy).To(Equal(corev1.ServiceExternalTrafficPolicyCluster))
		g.Expect(gi.Spec.DeclarePorts).To(Equal(ptr.To(true)))
	})
}

func TestValidationGuestWebhookBridgeDefaults(t *testing.T) {
	c := hostLab(t).Host.Client
	ns := testNamespace(t, c, "gwb-defaults")
	ctx := context.Background()

	t.Run("defaults applied when omitted", func(t *testing.T) {
		g := NewWithT(t)
		obj := newObject("GuestWebhookBridge", ns, "omitted", mergeYAML(t, gwbBase, `{}`))
		g.Expect(c.Create(ctx, obj, client.FieldValidation("Strict"))).To(Succeed())
		gwb := &guestnetv1.GuestWebhookBridge{}
		g.Expect(c.Get(ctx, client.ObjectKeyFromObject(obj), gwb)).To(Succeed())
		g.Expect(gwb.Spec.NodePortRange).To(Equal(guestnetv1.NodePortRange{Start: 30064, Size: 16}))
		g.Expect(gwb.Spec.Mode).To(Equal(guestnetv1.BridgeModeAuto))
	})

	// A typed object with a zero NodePortRange must get the default range, not be rejected
	// for start 0 / size 0.
	t.Run("typed Go object without nodePortRange and mode accepted and defaulted", func(t *testing.T) {
		g := NewWithT(t)
		gwb := &guestnetv1.GuestWebhookBridge{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "typed"},
			Spec: guestnetv1.GuestWebhookBridgeSpec{
				ClusterName: "tenant-a",
				APIServices: &guestnetv1.TargetSelector{Names: []string{"v1beta1.metrics.k8s.io"}},
			},
		}
		g.Expect(c.Create(ctx, gwb)).To(Succeed())
		g.Expect(gwb.Spec.NodePortRange).To(Equal(guestnetv1.NodePortRange{Start: 30064, Size: 16}))
		g.Expect(gwb.Spec.Mode).To(Equal(guestnetv1.BridgeModeAuto))
	})

	t.Run("typed Go object with an empty selector rejected", func(t *testing.T) {
		g := NewWithT(t)
		gwb := &guestnetv1.GuestWebhookBridge{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "typed-empty"},
			Spec: guestnetv1.GuestWebhookBridgeSpec{
				ClusterName:        "tenant-a",
				ValidatingWebhooks: &guestnetv1.TargetSelector{},
			},
		}
		err := c.Create(ctx, gwb)
		g.Expect(err).To(HaveOccurred())
		g.Expect(err.Error()).To(ContainSubstring("give names, a selector, or all: true"))
	})
}

// --- updates ------------------------------------------------------------------------------

func TestValidationImmutableClusterName(t *testing.T) {
	c := hostLab(t).Host.Client
	ns := testNamespace(t, c, "immutable")
	ctx := context.Background()

	for _, tc := range []struct {
		kind, base, otherChange string
	}{
		{"GuestIngress", giBase, `{ports: [{name: http, port: 80, nodePort: 30080}]}`},
		{"GuestWebhookBridge", gwbBase, `{mode: Always}`},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			g := NewWithT(t)
			obj := newObject(tc.kind, ns, strings.ToLower(tc.kind), mergeYAML(t, tc.base, `{}`))
			g.Expect(c.Create(ctx, obj)).To(Succeed())

			renamed := obj.DeepCopy()
			g.Expect(unstructured.SetNestedField(renamed.Object, "tenant-b", "spec", "clusterName")).To(Succeed())
			err := c.Update(ctx, renamed)
			g.Expect(err).To(HaveOccurred(), "changing clusterName was accepted")
			g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "unexpected kind of error: %v", err)
			g.Expect(err.Error()).To(ContainSubstring(`spec.clusterName: Invalid value: "tenant-b": clusterName is immutable`))

			// Other fields stay editable, and rewriting the same clusterName is no change.
			edited := obj.DeepCopy()
			edited.Object["spec"] = mergeYAML(t, tc.base, tc.otherChange)
			g.Expect(c.Update(ctx, edited)).To(Succeed())
		})
	}
}

// --- what kubectl shows -------------------------------------------------------------------

func TestValidationCRDNamesAndPrinterColumns(t *testing.T) {
	l := hostLab(t)
	c := l.Host.Client
	ctx := context.Background()

	for _, tc := range []struct {
		crd, kind, shortName string
		columns              []string
	}{
		{"guestingresses.guestnet.addons.cluster.x-k8s.io", "GuestIngress", "gi",
			[]string{"Cluster", "IP", "Endpoints", "Ready", "Age"}},
		{"guestwebhookbridges.guestnet.addons.cluster.x-k8s.io", "GuestWebhookBridge", "gwb",
			[]string{"Cluster", "Bridged", "Total", "Ready", "Age"}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			g := NewWithT(t)
			crd := &apiextensionsv1.CustomResourceDefinition{}
			g.Expect(c.Get(ctx, client.ObjectKey{Name: tc.crd}, crd)).To(Succeed())
			g.Expect(crd.Spec.Names.Kind).To(Equal(tc.kind))
			g.Expect(crd.Spec.Names.ShortNames).To(ConsistOf(tc.shortName))
			g.Expect(crd.Spec.Names.Categories).To(ContainElements("cluster-api", "guestnet"))
			g.Expect(crd.Spec.Scope).To(Equal(apiextensionsv1.NamespaceScoped))
			g.Expect(crd.Status.AcceptedNames.ShortNames).To(ConsistOf(tc.shortName), "the apiserver did not accept the short name")
			g.Expect(crd.Spec.Versions).To(HaveLen(1))
			v := crd.Spec.Versions[0]
			g.Expect(v.Name).To(Equal("v1alpha1"))
			g.Expect(v.Served && v.Storage).To(BeTrue())
			g.Expect(v.Subresources).NotTo(BeNil())
			g.Expect(v.Subresources.Status).NotTo(BeNil(), "no status subresource")
			var columns []string
			for _, col := range v.AdditionalPrinterColumns {
				columns = append(columns, col.Name)
			}
			g.Expect(columns).To(Equal(tc.columns))
		})
	}

	// The columns must also show the right values: ask the apiserver for the Table kubectl
	// prints, after a status update through the status subresource.
	t.Run("GuestIngress table", func(t *testing.T) {
		g := NewWithT(t)
		ns := testNamespace(t, c, "printer-columns")
		gi := &guestnetv1.GuestIngress{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant-a"},
			Spec: guestnetv1.GuestIngressSpec{
				ClusterName:  "tenant-a",
				GuestService: guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"},
				LoadBalancer: guestnetv1.LoadBalancerSpec{IP: "10.2.6.220"},
			},
		}
		g.Expect(c.Create(ctx, gi)).To(Succeed())
		gi.Status.LoadBalancerIP = "10.2.6.220"
		gi.Status.ReadyEndpoints = 3
		gi.Status.Conditions = []metav1.Condition{readyCondition()}
		g.Expect(c.Status().Update(ctx, gi)).To(Succeed())

		row := tableRow(t, l.Host.Config, "/apis/guestnet.addons.cluster.x-k8s.io/v1alpha1/namespaces/"+ns+"/guestingresses")
		g.Expect(row.columns).To(Equal([]string{"Name", "Cluster", "IP", "Endpoints", "Ready", "Age"}))
		g.Expect(row.cells[:5]).To(Equal([]string{"tenant-a", "tenant-a", "10.2.6.220", "3", "True"}))
	})

	t.Run("GuestWebhookBridge table", func(t *testing.T) {
		g := NewWithT(t)
		ns := testNamespace(t, c, "printer-columns")
		gwb := &guestnetv1.GuestWebhookBridge{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant-a"},
			Spec: guestnetv1.GuestWebhookBridgeSpec{
				ClusterName: "tenant-a",
				APIServices: &guestnetv1.TargetSelector{All: true},
			},
		}
		g.Expect(c.Create(ctx, gwb)).To(Succeed())
		gwb.Status.BridgedTargets = 1
		gwb.Status.TotalTargets = 2
		gwb.Status.Conditions = []metav1.Condition{readyCondition()}
		gwb.Status.Conditions[0].Status = metav1.ConditionFalse
		gwb.Status.Conditions[0].Reason = guestnetv1.NotReadyReason
		g.Expect(c.Status().Update(ctx, gwb)).To(Succeed())

		row := tableRow(t, l.Host.Config, "/apis/guestnet.addons.cluster.x-k8s.io/v1alpha1/namespaces/"+ns+"/guestwebhookbridges")
		g.Expect(row.columns).To(Equal([]string{"Name", "Cluster", "Bridged", "Total", "Ready", "Age"}))
		g.Expect(row.cells[:5]).To(Equal([]string{"tenant-a", "tenant-a", "1", "2", "False"}))
	})
}

func readyCondition() metav1.Condition {
	return metav1.Condition{
		Type: guestnetv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: guestnetv1.ReadyReason,
		Message: "", LastTransitionTime: metav1.Now(),
	}
}

type tableResult struct {
	columns []string
	cells   []string
}

// tableRow lists path as the Table kubectl prints and returns its only row.
func tableRow(t *testing.T, cfg *rest.Config, path string) tableResult {
	t.Helper()
	g := NewWithT(t)
	httpClient, err := rest.HTTPClientFor(cfg)
	g.Expect(err).NotTo(HaveOccurred())
	req, err := http.NewRequest(http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+path, http.NoBody)
	g.Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := httpClient.Do(req)
	g.Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	table := &metav1.Table{}
	g.Expect(json.NewDecoder(resp.Body).Decode(table)).To(Succeed())
	g.Expect(table.Rows).To(HaveLen(1))
	var res tableResult
	for _, col := range table.ColumnDefinitions {
		res.columns = append(res.columns, col.Name)
	}
	for _, cell := range table.Rows[0].Cells {
		res.cells = append(res.cells, fmt.Sprint(cell))
	}
	return res
}

// --- helpers ------------------------------------------------------------------------------

func newObject(kind, namespace, name string, spec map[string]any) *unstructured.Unstructured {
	obj := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	obj.SetAPIVersion(guestnetv1.GroupVersion.String())
	obj.SetKind(kind)
	obj.SetNamespace(namespace)
	obj.SetName(name)
	return obj
}

// mergeYAML merges patch into base (JSON merge patch: maps merge, everything else replaces,
// null deletes) and returns the result as an unstructured spec.
func mergeYAML(t *testing.T, base, patch string) map[string]any {
	t.Helper()
	var b, p map[string]any
	if err := yaml.Unmarshal([]byte(base), &b); err != nil {
		t.Fatalf("base spec: %v", err)
	}
	if err := yaml.Unmarshal([]byte(patch), &p); err != nil {
		t.Fatalf("patch %s: %v", patch, err)
	}
	return mergeMaps(b, p)
}

func mergeMaps(base, patch map[string]any) map[string]any {
	out := map[string]any{}
	if base != nil {
		out = runtime.DeepCopyJSON(base)
	}
	for k, v := range patch {
		switch pv := v.(type) {
		case nil:
			delete(out, k)
		case map[string]any:
			bv, _ := out[k].(map[string]any)
			out[k] = mergeMaps(bv, pv)
		default:
			out[k] = v
		}
	}
	return out
}

func toYAML(v any) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(data)
}

// ports returns n distinct ports as a YAML flow list.
func ports(n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf("{name: p%d, port: %d}", i, 8000+i)
	}
	return "[" + strings.Join(items, ", ") + "]"
}

// cidrs returns n distinct IPv4 CIDRs as a YAML flow list.
func cidrs(n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf("10.2.%d.0/29", i)
	}
	return "[" + strings.Join(items, ", ") + "]"
}

// stringMap returns n distinct string keys and values as a YAML flow map.
func stringMap(n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf("example.com/k%d: v%d", i, i)
	}
	return "{" + strings.Join(items, ", ") + "}"
}

// expressions returns n distinct label selector requirements as a YAML flow list.
func expressions(n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf("{key: k%d, operator: Exists}", i)
	}
	return "[" + strings.Join(items, ", ") + "]"
}

// labels returns n distinct labels as a YAML flow map.
func labels(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf("k%d: v", i)
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// names returns n distinct APIService names as a YAML flow list.
func names(n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf("v1beta%d.example.com", i)
	}
	return "[" + strings.Join(items, ", ") + "]"
}
