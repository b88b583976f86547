package leasehold

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every ```go block of this README and the repository's README is a whole
// program: each is built against this module and run against a node.
func TestTheReadmeExamplesBuildAndRun(t *testing.T) {
	n := startNode(t)
	module, _ := filepath.Abs(".")
	block := regexp.MustCompile("(?s)```go\n(.*?)```")
	for _, page := range []string{"README.md", "../../README.md"} {
		text, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range block.FindAllStringSubmatch(string(text), -1) {
			dir := t.TempDir()
			goMod := "module example\n\ngo 1.19\n\nrequire github.com/leasehold/leasehold/clients/go v0.0.0\n\n" +
				"replace github.com/leasehold/leasehold/clients/go => " + module + "\n"
			if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(goMod), 0o644); err != nil {
				t.Fatal(err)
			}
			// The pages name the default node; the test's is elsewhere.
			program := strings.ReplaceAll(m[1], "http://127.0.0.1:7419", n.url())
			if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(program), 0o644); err != nil {
				t.Fatal(err)
			}
			run := exec.Command("go", "run", ".")
			run.Dir = dir
			run.Env = append(os.Environ(), "LEASEHOLD_ENDPOINT="+n.url(), "GOFLAGS=-mod=mod", "GOPROXY=off")
			out, err := run.CombinedOutput()
			if err != nil {
				t.Fatalf("%s, go block %d: %v\n%s", page, i+1, err, out)
			}
			if !strings.Contains(string(out), "fence") {
				t.Fatalf("%s, go block %d printed no fence:\n%s", page, i+1, out)
			}
		}
	}
}
