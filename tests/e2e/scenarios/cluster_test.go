package scenarios

// The cluster the scenarios run against, as tests/e2e/cluster.sh brought it up and run.sh
// describes it in the environment, and the host-side commands a scenario uses: kubectl for what
// an operator types (applying flexd's manifests, exec, rollout), flexd on the node, mounts.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Cluster is what cluster.sh made: names and paths on the node, and a client of its API server.
type Cluster struct {
	Dir    string // the scratch dir (E2E_DIR): kubelet's dir, the plugin dir, flexd's state...
	Node   string // node 0's name: the node with the control plane, where ToolsPod runs
	NodeIP string
	// Every node, node 0 first (E2E_NODES of them: cluster.sh's node table).
	Nodes []Node
	// A dir every node sees at this same path: the nodes' shared storage (the loop images).
	SharedDir string
	// KubeletPluginDir is the plugin dir as the cluster's components see it (E2E_PLUGIN_DIR):
	// kubelet's volumePluginDir, kube-controller-manager's --flex-volume-plugin-dir, and so what
	// flexd manifests' --node-plugin-dir and any pod's hostPath of the plugin dir must say. By
	// default it is c.Path("plugins"); given a distribution's path (OpenShift 4's
	// /etc/kubernetes/kubelet-plugins/volume/exec), it is each node's own plugins dir
	// bind-mounted there in that node's mount namespace only (cluster.sh), and the host, where
	// the scenarios run, has nothing at it: what they read, write or run themselves stays
	// c.Path("plugins") (node.Path("plugins") for a worker's).
	KubeletPluginDir string
	Namespace        string // flexd's namespace
	// The node-only hostdir driver every cluster has installed, and its CSI name.
	Driver  string
	CSIName string
	// Images built into the node's containerd by cluster.sh.
	FlexdImage     string
	ToolsImage     string
	InstallerImage string
	// The previous build of flexd, for the rollout scenario to roll from.
	FlexdPreviousImage string
	// `flexd manifests` flags naming the CSI sidecars' images built here.
	SidecarImageFlags []string
	Repo              string // the repository's root
	Here              string // tests/e2e
	Kube              kubernetes.Interface
	// Config is the admin's client configuration the clients are made from.
	Config *rest.Config
}

var cluster *Cluster

// Node is one of the cluster's nodes. Node 0's files are the scratch dir's own; a worker's are
// under nodes/NAME, and its kubelet, plugin and flexd state dirs are mounted over node 0's paths
// in its own mount namespace (which the host does not see: MountsOn reads it).
type Node struct {
	Name string
	IP   string
	Dir  string // its own files: plugins/, flexd-state/, kubelet/ (a worker's), run/init.pid
}

// Path is a path under the node's own dir.
func (n Node) Path(parts ...string) string {
	return filepath.Join(append([]string{n.Dir}, parts...)...)
}

// NodeNamed is the cluster's node of that name, failing the spec when there is none.
func (c *Cluster) NodeNamed(name string) Node {
	ginkgo.GinkgoHelper()
	for _, node := range c.Nodes {
		if node.Name == name {
			return node
		}
	}
	ginkgo.Fail(fmt.Sprintf("no node %q in %v", name, c.Nodes))
	return Node{}
}

// Worker says whether the node is a worker (not node 0).
func (n Node) Worker() bool { return n.Name != cluster.Node }

// loadNodes is E2E_NODE_NAMES, E2E_NODE_IPS and E2E_NODE_DIRS, word by word.
func loadNodes() []Node {
	names, ips, dirs := strings.Fields(env("E2E_NODE_NAMES")), strings.Fields(env("E2E_NODE_IPS")), strings.Fields(env("E2E_NODE_DIRS"))
	gomega.Expect(ips).To(gomega.HaveLen(len(names)), "E2E_NODE_IPS for E2E_NODE_NAMES")
	gomega.Expect(dirs).To(gomega.HaveLen(len(names)), "E2E_NODE_DIRS for E2E_NODE_NAMES")
	gomega.Expect(strconv.Itoa(len(names))).To(gomega.Equal(env("E2E_NODES")), "E2E_NODE_NAMES for E2E_NODES")
	nodes := make([]Node, len(names))
	for i := range names {
		nodes[i] = Node{Name: names[i], IP: ips[i], Dir: dirs[i]}
	}
	return nodes
}

func env(name string) string {
	value := os.Getenv(name)
	if value == "" {
		ginkgo.Fail(fmt.Sprintf("%s is not set: run the scenarios with tests/e2e/run.sh", name))
	}
	return value
}

func loadCluster() *Cluster {
	c := &Cluster{
		Dir:                env("E2E_DIR"),
		Node:               env("E2E_NODE"),
		NodeIP:             env("E2E_NODE_IP"),
		Namespace:          env("E2E_NAMESPACE"),
		Driver:             env("E2E_DRIVER"),
		CSIName:            env("E2E_CSI_NAME"),
		FlexdImage:         env("E2E_FLEXD_IMAGE"),
		FlexdPreviousImage: env("E2E_FLEXD_PREVIOUS_IMAGE"),
		ToolsImage:         env("E2E_TOOLS_IMAGE"),
		InstallerImage:     env("E2E_INSTALLER_IMAGE"),
		SidecarImageFlags:  strings.Fields(env("E2E_SIDECAR_IMAGE_FLAGS")),
		Repo:               env("E2E_REPO"),
		Nodes:              loadNodes(),
		SharedDir:          env("E2E_SHARED_DIR"),
		KubeletPluginDir:   env("E2E_PLUGIN_DIR"),
	}
	gomega.Expect(c.Nodes[0].Name).To(gomega.Equal(c.Node), "node 0")
	c.Here = filepath.Join(c.Repo, "tests", "e2e")
	config, err := clientcmd.BuildConfigFromFlags("", filepath.Join(c.Dir, "kubeconfig"))
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "the cluster's kubeconfig")
	c.Config = config
	c.Kube, err = kubernetes.NewForConfig(config)
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "a client of the cluster's API server")
	return c
}

// Path is a path under the scratch dir.
func (c *Cluster) Path(parts ...string) string {
	return filepath.Join(append([]string{c.Dir}, parts...)...)
}

// Run runs a command on the host and returns its standard output; standard error is in the
// error (and in the spec's output).
func Run(ctx context.Context, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if stderr.Len() > 0 {
		fmt.Fprintf(ginkgo.GinkgoWriter, "%s %s: %s", filepath.Base(name), strings.Join(args, " "), stderr.String())
	}
	if err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// MustRun is Run that fails the spec when the command fails.
func MustRun(ctx context.Context, name string, args ...string) string {
	ginkgo.GinkgoHelper()
	out, err := Run(ctx, name, args...)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	return out
}

// Kubectl runs the cluster's kubectl (the scenarios run in the cluster's network namespace).
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return Run(ctx, c.Path("bin", "kube"), append([]string{"kubectl", "--kubeconfig=" + c.Path("kubeconfig")}, args...)...)
}

// MustKubectl is Kubectl that fails the spec when kubectl fails.
func (c *Cluster) MustKubectl(ctx context.Context, args ...string) string {
	ginkgo.GinkgoHelper()
	out, err := c.Kubectl(ctx, args...)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	return out
}

// Flexd runs flexd on the node, as the operator does: the node's plugin dir and state dir.
func (c *Cluster) Flexd(ctx context.Context, args ...string) (string, error) {
	return Run(ctx, c.Path("bin", "flexd"), append([]string{"--plugin-dir", c.Path("plugins"), "--state-dir", c.Path("flexd-state")}, args...)...)
}

// FlexdOn runs flexd on the host for one node's plugin dir and state dir (node 0's are Flexd's).
func (c *Cluster) FlexdOn(ctx context.Context, node Node, args ...string) (string, error) {
	return Run(ctx, c.Path("bin", "flexd"), append([]string{"--plugin-dir", node.Path("plugins"), "--state-dir", node.Path("flexd-state")}, args...)...)
}

// MustFlexdEverywhere runs flexd for every node's plugin dir and state dir (installing a
// driver on every node, as the installer DaemonSet would), failing the spec when one fails;
// node 0's output.
func (c *Cluster) MustFlexdEverywhere(ctx context.Context, args ...string) string {
	ginkgo.GinkgoHelper()
	var first string
	for i, node := range c.Nodes {
		out, err := c.FlexdOn(ctx, node, args...)
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "flexd on node %s", node.Name)
		if i == 0 {
			first = out
		}
	}
	return first
}

// FlexdEverywhere runs flexd for every node's plugin dir and state dir whatever it answers (a
// cleanup's uninstall, of a driver that may be on some nodes only).
func (c *Cluster) FlexdEverywhere(ctx context.Context, args ...string) {
	for _, node := range c.Nodes {
		_, _ = c.FlexdOn(ctx, node, args...)
	}
}

// MustFlexd is Flexd that fails the spec when flexd fails.
func (c *Cluster) MustFlexd(ctx context.Context, args ...string) string {
	ginkgo.GinkgoHelper()
	out, err := c.Flexd(ctx, args...)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	return out
}

// ClusterSh runs one of cluster.sh's commands for the nodes' faults (restart-kubelet,
// restart-node, stop-node NAME, start-node NAME).
func (c *Cluster) ClusterSh(ctx context.Context, args ...string) {
	ginkgo.GinkgoHelper()
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(c.Here, "cluster.sh")}, args...)...)
	cmd.Stdout, cmd.Stderr = ginkgo.GinkgoWriter, ginkgo.GinkgoWriter
	gomega.Expect(cmd.Run()).To(gomega.Succeed(), "tests/e2e/cluster.sh %s", strings.Join(args, " "))
}

// WriteRun writes a file under the scratch dir's run/ (kept with the logs of a failed run).
func (c *Cluster) WriteRun(name, content string) string {
	ginkgo.GinkgoHelper()
	path := c.Path("run", name)
	gomega.Expect(os.WriteFile(path, []byte(content), 0o644)).To(gomega.Succeed())
	return path
}

// The polling every wait uses: a loaded 2-core machine takes seconds for what takes
// milliseconds elsewhere, so waits are long and polls frequent.
const poll = time.Second

// WaitFor polls check until it returns nil, for up to timeout; the failure says what was
// awaited and the last error check returned.
func WaitFor(ctx context.Context, timeout time.Duration, what string, check func(context.Context) error) {
	ginkgo.GinkgoHelper()
	gomega.Eventually(ctx, check).WithTimeout(timeout).WithPolling(poll).Should(gomega.Succeed(), "waiting %s for %s", timeout, what)
}

// mountEntry is one line of a mountinfo file: the mount's id (a mount made again gets a new
// one) and its mount point.
type mountEntry struct {
	ID     string
	Target string
}

// readMountinfo is the mounts a mountinfo file lists.
func readMountinfo(path string) []mountEntry {
	ginkgo.GinkgoHelper()
	data, err := os.ReadFile(path)
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "reading %s", path)
	var mounts []mountEntry
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 4 {
			mounts = append(mounts, mountEntry{ID: fields[0], Target: unescapeMountinfo(fields[4])})
		}
	}
	return mounts
}

// targets are the mount points of the mounts.
func targets(mounts []mountEntry) []string {
	var targets []string
	for _, mount := range mounts {
		targets = append(targets, mount.Target)
	}
	return targets
}

// Mounts are the mount points on the host (the scenarios run in the host's mount namespace,
// which the cluster's mounts propagate to).
func Mounts() []string {
	ginkgo.GinkgoHelper()
	return targets(readMountinfo("/proc/self/mountinfo"))
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space, and so on).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// MountsOn are the mount points in the node's mount namespace: the host's for node 0 (whose
// mounts propagate to it), the worker's own (its init's) for a worker.
func MountsOn(node Node) []string {
	ginkgo.GinkgoHelper()
	if !node.Worker() {
		return Mounts()
	}
	init := strings.TrimSpace(ReadFile(node.Path("run", "init.pid")))
	return targets(readMountinfo("/proc/" + init + "/mountinfo"))
}

// MountCount is how many times path is a mount point.
func MountCount(path string) int {
	n := 0
	for _, target := range Mounts() {
		if target == path {
			n++
		}
	}
	return n
}

// Mounted fails unless path is a mount point.
func mounted(path string) func(context.Context) error {
	return func(context.Context) error {
		if MountCount(path) == 0 {
			return fmt.Errorf("%s is not mounted", path)
		}
		return nil
	}
}

// notMounted fails while path is a mount point.
func notMounted(path string) func(context.Context) error {
	return func(context.Context) error {
		if n := MountCount(path); n > 0 {
			return fmt.Errorf("%s is mounted %d times", path, n)
		}
		return nil
	}
}

// VolumeTarget is where kubelet has a pod's CSI volume mounted.
func (c *Cluster) VolumeTarget(podUID, volume string) string {
	return c.Path("kubelet", "pods", podUID, "volumes", "kubernetes.io~csi", volume, "mount")
}

// VolumeRecords is `flexd volume list` on the node: flexd's records of what it published.
func (c *Cluster) VolumeRecords(ctx context.Context) string {
	ginkgo.GinkgoHelper()
	return c.MustFlexd(ctx, "volume", "list")
}

// noRecord fails while flexd holds a record of the target.
func (c *Cluster) noRecord(target string) func(context.Context) error {
	return func(ctx context.Context) error {
		records, err := c.Flexd(ctx, "volume", "list")
		if err != nil {
			return err
		}
		if strings.Contains(records, target) {
			return fmt.Errorf("flexd still has a record of %s:\n%s", target, records)
		}
		return nil
	}
}

// ExpectUnpublished waits until target is unmounted and flexd's record of it is gone: what
// every pod's deletion must leave.
func (c *Cluster) ExpectUnpublished(ctx context.Context, target string) {
	ginkgo.GinkgoHelper()
	WaitFor(ctx, 60*time.Second, target+" to be unmounted", notMounted(target))
	WaitFor(ctx, 30*time.Second, "flexd's record of "+target+" to go", c.noRecord(target))
}

// ReadFile reads a file on the node, failing the spec when it cannot.
func ReadFile(path string) string {
	ginkgo.GinkgoHelper()
	data, err := os.ReadFile(path)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	return string(data)
}

// Summary is a scenario's report for people: logs/scenario-NAME.summary in the scratch dir,
// which run.sh prints after the run whatever its outcome. What it says is reported, not
// asserted (the assertions say what they expected themselves).
type Summary struct{ path string }

// NewSummary starts the scenario's summary afresh.
func (c *Cluster) NewSummary(name string) *Summary {
	ginkgo.GinkgoHelper()
	s := &Summary{path: c.Path("logs", "scenario-"+name+".summary")}
	if err := os.Remove(s.path); err != nil && !os.IsNotExist(err) {
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
	}
	return s
}

// Printf adds a line (or lines) to the summary, and to the spec's output.
func (s *Summary) Printf(format string, args ...any) {
	ginkgo.GinkgoHelper()
	text := strings.TrimRight(fmt.Sprintf(format, args...), "\n") + "\n"
	fmt.Fprint(ginkgo.GinkgoWriter, text)
	f, err := os.OpenFile(s.path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	_, err = f.WriteString(text)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	gomega.Expect(f.Close()).To(gomega.Succeed())
}
