package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// repoRoot is the provider's repository, three levels up from this module.
const repoRoot = "../../.."

// The Dockerfile is for people with Docker (no engine runs here: `make docker-build`); read
// by BuildKit's own Dockerfile parser, it builds what this tool builds: the manager at the
// same path, with the Makefile's build flags, run by the same user with the same entrypoint.
func TestDockerfile_BuildsTheImageThisToolBuilds(t *testing.T) {
	stages := parseDockerfile(t)
	if len(stages) != 2 {
		t.Fatalf("%d stages, want a build stage and the final stage", len(stages))
	}
	build, final := stages[0], stages[1]
	if build.Name != "builder" || build.BaseName != "golang:${GO_VERSION}" || build.Platform != "$BUILDPLATFORM" {
		t.Errorf("build stage: FROM --platform=%s %s AS %s; want the Go image on the build platform (cross-compiling)", build.Platform, build.BaseName, build.Name)
	}
	if final.BaseName != "gcr.io/distroless/static:nonroot" {
		t.Errorf("final stage FROM %s", final.BaseName)
	}

	goflags, ldflags := makefileVar(t, "MANAGER_GOFLAGS :="), makefileVar(t, "MANAGER_LDFLAGS ?=")
	if got := argDefault(t, build, "ldflags"); got != ldflags {
		t.Errorf("ARG ldflags=%q, the Makefile's MANAGER_LDFLAGS is %q", got, ldflags)
	}
	goBuild := runCommands(t, build, "go build ")
	if len(goBuild) != 1 {
		t.Fatalf("%d RUN commands run go build, want 1", len(goBuild))
	}
	line := strings.Join(goBuild[0].CmdLine, " ")
	for _, want := range []string{"CGO_ENABLED=0", "GOOS=${TARGETOS}", "GOARCH=${TARGETARCH}", "go build " + goflags + ` -ldflags "${ldflags}" -o manager .`} {
		if !strings.Contains(line, want) {
			t.Errorf("the go build RUN lacks %q: %s", want, line)
		}
	}
	if got := cacheTargets(goBuild[0]); !slices.Equal(got, []string{"/go/pkg/mod", "/root/.cache/go-build"}) {
		t.Errorf("go build cache mounts: %v", got)
	}
	download := runCommands(t, build, "go mod download")
	if len(download) != 1 || !slices.Equal(cacheTargets(download[0]), []string{"/go/pkg/mod"}) {
		t.Errorf("go mod download: want one RUN with the module cache mounted")
	}

	var user, workdir string
	var entrypoint []string
	var copied bool
	labels := map[string]bool{}
	for _, c := range final.Commands {
		switch c := c.(type) {
		case *instructions.UserCommand:
			user = c.User
		case *instructions.WorkdirCommand:
			workdir = c.Path
		case *instructions.EntrypointCommand:
			if c.PrependShell {
				t.Errorf("ENTRYPOINT in shell form: the image has no shell")
			}
			entrypoint = c.CmdLine
		case *instructions.CopyCommand:
			copied = c.From == "builder" && slices.Equal(c.SourcePaths, []string{"/workspace/manager"}) && c.DestPath == ManagerPath
		case *instructions.LabelCommand:
			for _, kv := range c.Labels {
				labels[kv.Key] = true
			}
		}
	}
	if user != nonRootUser || workdir != "/" || !slices.Equal(entrypoint, []string{ManagerPath}) || !copied {
		t.Errorf("final stage: USER %q, WORKDIR %q, ENTRYPOINT %q, manager copied to %s: %v; want %q, /, [%s], true",
			user, workdir, entrypoint, ManagerPath, copied, nonRootUser, ManagerPath)
	}
	for _, l := range []string{labelSource, labelVersion, labelRevision} {
		if !labels[l] {
			t.Errorf("final stage: no LABEL %s", l)
		}
	}
}

// Every file the manager is built from reaches the Docker build: the Dockerfile copies it and
// .dockerignore, read as Docker reads it, does not exclude it; test files stay out.
func TestDockerfile_BuildContextHoldsEverySourceOfTheManager(t *testing.T) {
	stages := parseDockerfile(t)
	var copied []string
	for _, c := range stages[0].Commands {
		if c, ok := c.(*instructions.CopyCommand); ok && c.From == "" {
			copied = append(copied, c.SourcePaths...)
		}
	}
	f, err := os.Open(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	ignore, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command("go", "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}} {{join .GoFiles \" \"}}{{end}}{{end}}", ".")
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	sources := []string{"go.mod", "go.sum"}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		dir, err := filepath.Rel(root, fields[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, file := range fields[1:] {
			sources = append(sources, filepath.ToSlash(filepath.Join(dir, file)))
		}
	}
	if len(sources) < 10 {
		t.Fatalf("go list found only %v", sources)
	}
	for _, src := range sources {
		if excluded, err := ignore.MatchesOrParentMatches(src); err != nil || excluded {
			t.Errorf(".dockerignore excludes %s (err %v)", src, err)
		}
		if !slices.ContainsFunc(copied, func(c string) bool { return c == src || strings.HasPrefix(src, strings.TrimSuffix(c, "/")+"/") }) {
			t.Errorf("the Dockerfile does not copy %s (COPY %v)", src, copied)
		}
	}
	for _, out := range []string{"api/v1alpha1/validation_test.go", "out/guestnet-image.oci.tar", "bin/manager-linux-amd64", ".git/HEAD"} {
		if excluded, _ := ignore.MatchesOrParentMatches(out); !excluded {
			t.Errorf(".dockerignore lets %s into the build context", out)
		}
	}
}

func parseDockerfile(t *testing.T) []instructions.Stage {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	for _, w := range res.Warnings {
		t.Errorf("Dockerfile: %s", w.Short)
	}
	stages, _, err := instructions.Parse(res.AST, nil)
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	return stages
}

// runCommands are the stage's RUN commands whose command line contains containing, with their
// --mount flags parsed (BuildKit parses them when it expands the command).
func runCommands(t *testing.T, s instructions.Stage, containing string) []*instructions.RunCommand {
	t.Helper()
	var out []*instructions.RunCommand
	for _, c := range s.Commands {
		if r, ok := c.(*instructions.RunCommand); ok && strings.Contains(strings.Join(r.CmdLine, " "), containing) {
			if err := r.Expand(shellWord()); err != nil {
				t.Fatalf("%s: %v", r, err)
			}
			out = append(out, r)
		}
	}
	return out
}

// shellWord expands a word of the Dockerfile as BuildKit does (quotes, escapes), without
// build arguments.
func shellWord() instructions.SingleWordExpander {
	lex := shell.NewLex(parser.DefaultEscapeToken)
	return func(word string) (string, error) {
		out, _, err := lex.ProcessWord(word, shell.EnvsFromSlice(nil))
		return out, err
	}
}

func cacheTargets(r *instructions.RunCommand) []string {
	var targets []string
	for _, m := range instructions.GetMounts(r) {
		if m.Type == instructions.MountTypeCache {
			targets = append(targets, m.Target)
		}
	}
	return targets
}

func argDefault(t *testing.T, s instructions.Stage, name string) string {
	t.Helper()
	for _, c := range s.Commands {
		if a, ok := c.(*instructions.ArgCommand); ok {
			for _, kv := range a.Args {
				if kv.Key == name && kv.Value != nil {
					v, err := shellWord()(*kv.Value)
					if err != nil {
						t.Fatalf("ARG %s: %v", name, err)
					}
					return v
				}
			}
		}
	}
	t.Fatalf("no ARG %s with a default in stage %s", name, s.Name)
	return ""
}

// makefileVar reads the value of the Makefile line that starts with prefix ("NAME :=").
func makefileVar(t *testing.T, prefix string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(prefix) + `(.*)$`).FindStringSubmatch(string(data))
	if m == nil {
		t.Fatalf("the Makefile has no %s", prefix)
	}
	return strings.TrimSpace(m[1])
}
