// Command recorder is a FlexVolume driver that records each call-out and then runs the real
// driver: the oracle scenario (tests/e2e/scenarios/oracle_test.go) installs it in front of a
// driver and lets kubelet's own FlexVolume plugin and flexd call the same driver through it, so
// their call-outs can be compared record by record.
//
// It reads recorder.json beside its own executable: {"exec": real driver, "log": JSON-lines
// file}. Paths must resolve both on the node (kubelet, kube-controller-manager, flexd's node pod,
// `flexd migrate` on the host) and in flexd's controller pod, which mounts the plugin dir and the
// log's dir at their host paths. The log's is absolute; exec is absolute, or relative to the
// recorder's own dir (a driver beside it in the plugin dir: the plugin dir's path differs between
// the host and the nodes when E2E_PLUGIN_DIR gives kubelet a distribution's path, and the
// controller pod has only kubelet's).
//
// The real driver gets exactly what the recorder got: argv (its own path as argv[0]), stdin,
// environment, working directory, umask and process group; its stdout and stderr are passed
// through as they come (kubelet reads both as one stream, flexd only stdout) and its exit status
// is the recorder's. Each record is one line: who called (the parent's command line), argv after
// the executable, the environment's names and a few values drivers depend on, working
// directory, umask, user, stdin, mount namespace, exit status, stdout and stderr. Values of
// kubernetes.io/secret/* options are replaced by their SHA-256, so records compare byte for byte
// without holding a secret. Static (CGO_ENABLED=0): it also runs in flexd's image, which has no
// shell.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"
)

type config struct {
	Exec string `json:"exec"`
	Log  string `json:"log"`
}

type record struct {
	Time     string            `json:"time"`
	Driver   string            `json:"driver"`
	Caller   string            `json:"caller"`
	Argv     []string          `json:"argv"`
	EnvNames []string          `json:"envNames"`
	Env      map[string]string `json:"env"`
	Cwd      string            `json:"cwd"`
	Umask    string            `json:"umask"`
	UID      int               `json:"uid"`
	GID      int               `json:"gid"`
	Stdin    string            `json:"stdin"`
	MountNS  string            `json:"mountNamespace"`
	Exit     int               `json:"exit"`
	Stdout   string            `json:"stdout"`
	Stderr   string            `json:"stderr"`
	Millis   int64             `json:"millis"`
}

// The environment values a driver's behaviour commonly depends on; every other variable is
// recorded by name only (kubelet's environment is its host's, and may hold anything).
var envValues = []string{"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "USER", "SHELL"}

var secretOption = regexp.MustCompile(`("kubernetes\.io/secret/(?:[^"\\]|\\.)*":\s*")((?:[^"\\]|\\.)*)(")`)

func redact(s string) string {
	return secretOption.ReplaceAllStringFunc(s, func(m string) string {
		parts := secretOption.FindStringSubmatch(m)
		sum := sha256.Sum256([]byte(parts[2]))
		return parts[1] + "sha256:" + hex.EncodeToString(sum[:8]) + parts[3]
	})
}

func fail(format string, args ...any) {
	msg, _ := json.Marshal("recorder: " + fmt.Sprintf(format, args...))
	fmt.Printf("{\"status\":\"Failure\",\"message\":%s}\n", msg)
	os.Exit(1)
}

func main() {
	self, err := os.Executable()
	if err != nil {
		fail("own path: %v", err)
	}
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(self), "recorder.json"))
	if err != nil {
		fail("config: %v", err)
	}
	var cfg config
	if err := json.Unmarshal(raw, &cfg); err != nil || cfg.Exec == "" || cfg.Log == "" {
		fail("config %s: needs exec and log (%v)", raw, err)
	}
	if !filepath.IsAbs(cfg.Exec) {
		cfg.Exec = filepath.Join(filepath.Dir(self), cfg.Exec)
	}

	rec := record{Time: time.Now().UTC().Format(time.RFC3339Nano), Argv: os.Args[1:]}
	// The driver's directory in the plugin dir: vendor~driver.
	rec.Driver = strings.Replace(filepath.Base(filepath.Dir(self)), "~", "/", 1)
	rec.Caller = caller()
	env := os.Environ()
	rec.Env = map[string]string{}
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		rec.EnvNames = append(rec.EnvNames, name)
		for _, wanted := range envValues {
			if name == wanted {
				rec.Env[name] = value
			}
		}
	}
	sort.Strings(rec.EnvNames)
	rec.Cwd, _ = os.Getwd()
	rec.Umask = statusField("Umask")
	rec.UID, rec.GID = os.Getuid(), os.Getgid()
	rec.Stdin, _ = os.Readlink("/proc/self/fd/0")
	rec.MountNS, _ = os.Readlink("/proc/self/ns/mnt")

	var stdout, stderr bytes.Buffer
	cmd := exec.Command(cfg.Exec, os.Args[1:]...)
	cmd.Args[0] = cfg.Exec
	cmd.Stdin = os.Stdin
	cmd.Stdout = io.MultiWriter(os.Stdout, &stdout)
	cmd.Stderr = io.MultiWriter(os.Stderr, &stderr)
	started := time.Now()
	err = cmd.Run()
	rec.Millis = time.Since(started).Milliseconds()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		rec.Exit = exitErr.ExitCode()
		if status, ok := exitErr.Sys().(syscall.WaitStatus); ok && status.Signaled() {
			rec.Exit = 128 + int(status.Signal())
		}
	default:
		fail("running %s: %v", cfg.Exec, err)
	}
	for i, arg := range rec.Argv {
		rec.Argv[i] = redact(arg)
	}
	rec.Stdout, rec.Stderr = redact(stdout.String()), redact(stderr.String())
	writeRecord(cfg.Log, rec)
	os.Exit(rec.Exit)
}

// caller is the parent's command line, so records say whether kubelet,
// kube-controller-manager or flexd made the call.
func caller() string {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", os.Getppid()))
	if err != nil {
		return "?"
	}
	args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	args[0] = filepath.Base(args[0])
	return strings.Join(args, " ")
}

func statusField(name string) string {
	raw, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(raw), "\n") {
		if value, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(value)
		}
	}
	return ""
}

// writeRecord appends one line under an exclusive lock: concurrent call-outs do not interleave.
// A record that cannot be written leaves the call-out's result alone (the comparison then finds
// the record missing).
func writeRecord(path string, rec record) {
	line, err := json.Marshal(rec)
	if err != nil {
		return
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "recorder: %v\n", err)
		return
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err == nil {
		defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	}
	f.Write(append(line, '\n'))
}
