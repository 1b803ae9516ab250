package workerports_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// docs/worker-ports.md states each invariant and names its test: every test it names exists.
// The reasons and the MachineDeployment annotation of a stopped repoint are documented where
// users look for them.
func TestDocsNameTheInvariantsTests(t *testing.T) {
	g := NewWithT(t)
	root := filepath.Join("..", "..")
	page := readFile(t, filepath.Join(root, "docs", "worker-ports.md"))
	_, invariants, found := strings.Cut(page, "\n## Invariants\n")
	g.Expect(found).To(BeTrue(), "docs/worker-ports.md has no Invariants section")
	invariants, _, _ = strings.Cut(invariants, "\n## ")

	named := regexp.MustCompile("`(Test[A-Za-z0-9_]+)`").FindAllStringSubmatch(invariants, -1)
	g.Expect(named).NotTo(BeEmpty())
	var sources strings.Builder
	for _, dir := range []string{"controllers/workerports", "internal/ports", "e2e"} {
		files, err := filepath.Glob(filepath.Join(root, dir, "*_test.go"))
		g.Expect(err).NotTo(HaveOccurred())
		for _, f := range files {
			sources.WriteString(readFile(t, f))
		}
	}
	for _, m := range named {
		g.Expect(strings.Contains(sources.String(), "func "+m[1]+"(t *testing.T)")).To(BeTrue(), "docs/worker-ports.md names %s, which does not exist", m[1])
	}

	for _, doc := range []string{"worker-ports.md", "runbook.md", "api.md"} {
		text := readFile(t, filepath.Join(root, "docs", doc))
		for _, reason := range []string{guestnetv1.RepointRevertedReason, guestnetv1.TemplateNameTakenReason} {
			g.Expect(strings.Contains(text, "`"+reason+"`")).To(BeTrue(), "docs/%s does not mention %s", doc, reason)
		}
	}
	g.Expect(strings.Contains(page, guestnetv1.RepointedFromAnnotation)).To(BeTrue(), "docs/worker-ports.md does not name %s", guestnetv1.RepointedFromAnnotation)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return string(data)
}
