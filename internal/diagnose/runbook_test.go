package diagnose

import (
	"os"
	"strings"
	"testing"
)

// Every section a result points at exists in docs/runbook.md (an <a id> anchor), and has a
// title, the symptom, right below it.
func TestRunbookAnchorsExist(t *testing.T) {
	data, err := os.ReadFile("../../docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	for _, rb := range []string{
		rbGuestUnreachable, rbKubeconfigRefused, rbNoWorkers, rbNoEndpoints, rbUndeclaredPort, rbTunnelPort, rbNoIP,
		rbWorkerRollout, rbRepointStopped, rbAPIServiceAvailable, rbWebhookFailed, rbTLS, rbKonnectivity, rbHelmRevert,
		rbWeakened, rbOrphaned, rbManager, rbNotAdmitted,
		rbNodeAddress, rbNodeUninitialized, rbKubeletNotExternal, rbCiliumNodeIP, rbControlPlaneEndpoint,
	} {
		path, anchor, ok := strings.Cut(rb, "#")
		if !ok || path != runbookDoc {
			t.Errorf("%s: not a section of %s", rb, runbookDoc)
			continue
		}
		tag := `<a id="` + anchor + `"></a>` + "\n### "
		if !strings.Contains(doc, tag) {
			t.Errorf("%s: docs/runbook.md has no %q followed by a ### title", rb, `<a id="`+anchor+`"></a>`)
		}
	}
}
