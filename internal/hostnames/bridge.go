package hostnames

import "strconv"

// Names of the objects guestnet creates for a GuestWebhookBridge: per bridged guest Service, a
// NodePort Service next to it in the guest, an ExternalName Service in the guest when an
// APIService is among its targets, and a ClusterIP Service in the host (in the Cluster's
// namespace) whose DNS name the guest apiserver dials.

// BridgeHostService names the host ClusterIP Service for the guest Service svcNamespace/svcName
// of cluster: "<cluster>-<namespace>-<service>", e.g. "tenant-a-cert-manager-cert-manager-webhook"
// (hashed when longer than a Service name may be). It lives in the Cluster's namespace.
func BridgeHostService(cluster, svcNamespace, svcName string) string {
	return ServiceName(cluster + "-" + svcNamespace + "-" + svcName)
}

// BridgeHostServiceDisambiguated is BridgeHostService with a hash of namespace and name, for
// the rare guest Service whose readable name another one of the same cluster already has.
func BridgeHostServiceDisambiguated(cluster, svcNamespace, svcName string) string {
	return withHash(ServiceName(cluster+"-"+svcNamespace+"-"+svcName), cluster+"/"+svcNamespace+"/"+svcName, MaxServiceName)
}

// BridgeNodePortService names the guest NodePort Service guestnet puts next to the guest
// Service svcName (same namespace): "<service>-guestnet-nodeport".
func BridgeNodePortService(svcName string) string {
	return ServiceName(svcName + "-guestnet-nodeport")
}

// BridgeExternalNameService names the guest ExternalName Service a bridged APIService is
// pointed at, next to the guest Service svcName: "<service>-guestnet". The aggregator
// verifies the APIService's certificate for "<this name>.<namespace>.svc".
func BridgeExternalNameService(svcName string) string {
	return ServiceName(svcName + "-guestnet")
}

// ServiceDNSName is the name the guest apiserver resolves for a Service: "<name>.<namespace>.svc".
func ServiceDNSName(namespace, name string) string {
	return name + "." + namespace + ".svc"
}

// BridgeURL is the webhook URL of a bridged webhook: https://<host Service DNS name>[:port]<path>.
// Port 443 is left out, so the URL is exactly what cert-manager's chart renders for
// webhook.url.host=<host Service DNS name>: switching the chart to it keeps the bridge.
func BridgeURL(hostNamespace, hostService string, port int32, path string) string {
	host := ServiceDNSName(hostNamespace, hostService)
	if port != 443 {
		host += ":" + strconv.Itoa(int(port))
	}
	return "https://" + host + path
}
