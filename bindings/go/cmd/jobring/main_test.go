package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// As a rank (COURIER_TEST_GO_JOBRING set), the test binary is the example itself.
func TestMain(m *testing.M) {
	if os.Getenv("COURIER_TEST_GO_JOBRING") != "" {
		if err := run(); err != nil {
			os.Stderr.WriteString("jobring: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func ciOrSkip(t *testing.T, why string) {
	if v := os.Getenv("CI"); v != "" && v != "0" && v != "false" {
		t.Fatalf("cannot run in CI: %s", why)
	}
	t.Skipf("SKIPPED: %s", why)
}

func runJob(t *testing.T, launcher []string, n int, via string) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{}, launcher[1:]...), self)
	cmd := exec.Command(launcher[0], args...)
	cmd.Env = append(os.Environ(), "COURIER_TEST_GO_JOBRING=1",
		"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", launcher, err, out)
	}
	if got := strings.Count(string(out), "ring and all-to-all OK"); got != n {
		t.Fatalf("%v: %d ranks OK, want %d:\n%s", launcher, got, n, out)
	}
	if !strings.Contains(string(out), via) {
		t.Fatalf("%v: not run via %s:\n%s", launcher, via, out)
	}
}

func TestJobOfOne(t *testing.T) {
	if err := run(); err != nil {
		t.Fatal(err)
	}
}

func TestUnderCourierRun(t *testing.T) {
	courier, _ := filepath.Abs("../../../../target/release/courier")
	if _, err := os.Stat(courier); err != nil {
		ciOrSkip(t, "target/release/courier is not built (cargo build --release -p courier-cli)")
	}
	for _, n := range []int{1, 2, 4} {
		runJob(t, []string{courier, "run", "-n", strconv.Itoa(n)}, n, "courier run")
	}
}

func TestUnderMpirun(t *testing.T) {
	if _, err := exec.LookPath("mpirun.openmpi"); err != nil {
		ciOrSkip(t, "mpirun.openmpi is not installed (scripts/launchers.sh)")
	}
	for _, n := range []int{2, 4} {
		runJob(t, []string{"mpirun.openmpi", "--oversubscribe", "--allow-run-as-root", "-n", strconv.Itoa(n)}, n, "pmix")
	}
}
