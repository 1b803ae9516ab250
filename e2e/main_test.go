package e2e

import (
	"context"
	"testing"
	"time"

	utilrand "k8s.io/apimachinery/pkg/util/rand"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

// The end-to-end tests of this package share one lab (host + guest control planes): it takes
// seconds to start, and every test works in namespaces of its own.
var shared = lab.Shared{DirPrefix: "guestnet-e2e"}

func TestMain(m *testing.M) { shared.Main(m) }

// startLab returns the package's lab, starting it on first use. The test is skipped (or
// failed under CI) when it does not run inside the lab's network namespace.
func startLab(t *testing.T) *lab.Lab { return shared.Get(t) }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// uniqueName gives each test its own namespaces and objects in the shared lab.
func uniqueName(prefix string) string {
	return prefix + "-" + utilrand.String(5)
}
