package scenarios

// flexd as an operator deploys it: `flexd manifests` on the node, applied unmodified with
// kubectl, and what the scenarios check of the pods it makes.

import (
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// pluginDirName is a driver's directory name in the plugin dir: VENDOR/NAME as VENDOR~NAME.
func pluginDirName(driver string) string { return strings.Replace(driver, "/", "~", 1) }

// Installed says whether the driver is in the node's plugin dir.
func (c *Cluster) Installed(driver string) bool {
	_, err := os.Stat(c.Path("plugins", pluginDirName(driver)))
	return err == nil
}

// OperatorFlags are this cluster's choices for `flexd manifests` of the drivers deployed (every
// installed one when none is named): its plugin dir (as kubelet sees it: KubeletPluginDir) and
// kubelet dir, inline volumes for the hostdir drivers (the oracle's inline volume, the fault
// pods), which are offered only when asked for. No driver needs a privileged controller: the loop
// driver's attach (and its recorder's) only claims the volume. `flexd manifests` refuses a choice
// about a driver it does not deploy.
func (c *Cluster) OperatorFlags(deployed ...string) []string {
	chosen := func(driver string) bool {
		return c.Installed(driver) && (len(deployed) == 0 || slices.Contains(deployed, driver))
	}
	// The cluster's version, as an operator passes it: manifests choose the sidecars (the
	// e2e's own sidecar images, SidecarImageFlags, are built for the same minor by tools.sh).
	version, err := c.Kube.Discovery().ServerVersion()
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "the API server's version")
	flags := []string{"--image", c.FlexdImage, "--kubelet-dir", c.Path("kubelet"), "--node-plugin-dir", c.KubeletPluginDir,
		"--kubernetes-version", version.GitVersion}
	for _, driver := range []string{c.Driver, "e2e/rec-hostdir"} {
		if chosen(driver) {
			flags = append(flags, "--inline-volumes", driver)
		}
	}
	return flags
}

// driversNamed are the drivers `--driver NAME` arguments name.
func driversNamed(args []string) []string {
	var drivers []string
	for i, arg := range args {
		if arg == "--driver" && i+1 < len(args) {
			drivers = append(drivers, args[i+1])
		}
	}
	return drivers
}

// ApplyManifests applies `flexd manifests ARGS... OPERATOR-FLAGS` (saved as run/NAME.yaml)
// and waits for the node DaemonSet's rollout (and the controller's, when there is one).
func (c *Cluster) ApplyManifests(ctx context.Context, name string, args ...string) string {
	ginkgo.GinkgoHelper()
	manifests := c.applyManifestsNoWait(ctx, name, args...)
	// `rollout status` of a DaemonSet that wants no pods yet is done at once: on a cluster just
	// up, the DaemonSet controller can count the nodes before it has seen them.
	WaitFor(ctx, 120*time.Second, "flexd-node to be scheduled on every node", func(ctx context.Context) error {
		daemonset, err := c.Kube.AppsV1().DaemonSets(c.Namespace).Get(ctx, "flexd-node", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if scheduled := int(daemonset.Status.DesiredNumberScheduled); scheduled < len(c.Nodes) {
			return fmt.Errorf("on %d of %d nodes", scheduled, len(c.Nodes))
		}
		return nil
	})
	c.MustKubectl(ctx, "-n", c.Namespace, "rollout", "status", "daemonset/flexd-node", "--timeout=240s")
	if strings.Contains(manifests, "name: flexd-controller\n") {
		c.MustKubectl(ctx, "-n", c.Namespace, "rollout", "status", "deployment/flexd-controller", "--timeout=300s")
	}
	return manifests
}

// applyManifestsNoWait applies `flexd manifests ARGS... OPERATOR-FLAGS` (saved as
// run/NAME.yaml), not waiting for what it rolls out.
func (c *Cluster) applyManifestsNoWait(ctx context.Context, name string, args ...string) string {
	ginkgo.GinkgoHelper()
	manifests := c.MustFlexd(ctx, append(append([]string{"manifests"}, args...), c.OperatorFlags(driversNamed(args)...)...)...)
	c.MustKubectl(ctx, "apply", "-f", c.WriteRun(name+".yaml", manifests))
	return manifests
}

// ApplyAllManifests deploys flexd for every installed driver with the sidecars built here.
func (c *Cluster) ApplyAllManifests(ctx context.Context, name string) string {
	ginkgo.GinkgoHelper()
	return c.ApplyManifests(ctx, name, c.SidecarImageFlags...)
}

// CSINodeDrivers are the drivers kubelet has registered on node 0.
func (c *Cluster) CSINodeDrivers(ctx context.Context) ([]string, error) {
	return c.CSINodeDriversOn(ctx, c.Node)
}

// CSINodeDriversOn are the drivers kubelet has registered on the node.
func (c *Cluster) CSINodeDriversOn(ctx context.Context, node string) ([]string, error) {
	csinode, err := c.Kube.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var names []string
	for _, driver := range csinode.Spec.Drivers {
		names = append(names, driver.Name)
	}
	return names, nil
}

// WaitCSINodeLists waits until every node's kubelet lists the CSI driver in its CSINode.
func (c *Cluster) WaitCSINodeLists(ctx context.Context, csiName string) {
	ginkgo.GinkgoHelper()
	for _, node := range c.Nodes {
		WaitFor(ctx, 120*time.Second, "CSINode "+node.Name+" to list "+csiName, func(ctx context.Context) error {
			names, err := c.CSINodeDriversOn(ctx, node.Name)
			if err != nil {
				return err
			}
			if !slices.Contains(names, csiName) {
				return fmt.Errorf("CSINode lists %v", names)
			}
			return nil
		})
	}
}

// WaitCSINodeLacks waits until no node's kubelet lists the CSI driver.
func (c *Cluster) WaitCSINodeLacks(ctx context.Context, csiName string) {
	ginkgo.GinkgoHelper()
	for _, node := range c.Nodes {
		WaitFor(ctx, 120*time.Second, "CSINode "+node.Name+" to drop "+csiName, func(ctx context.Context) error {
			names, err := c.CSINodeDriversOn(ctx, node.Name)
			if err != nil {
				return err
			}
			if slices.Contains(names, csiName) {
				return fmt.Errorf("CSINode still lists %s", csiName)
			}
			return nil
		})
	}
}

// NodePod is flexd's node pod on node 0.
func (c *Cluster) NodePod(ctx context.Context) *corev1.Pod {
	ginkgo.GinkgoHelper()
	return c.NodePodOn(ctx, c.Node)
}

// NodePodOn is flexd's node pod on the node.
func (c *Cluster) NodePodOn(ctx context.Context, node string) *corev1.Pod {
	ginkgo.GinkgoHelper()
	pods, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=flexd-node",
		FieldSelector: "spec.nodeName=" + node,
	})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	gomega.Expect(pods.Items).To(gomega.HaveLen(1), "flexd's node pods on %s", node)
	return &pods.Items[0]
}

// PodState is a pod's UID and its first container's restart count: what changes when the pod
// is replaced or its container restarted.
type PodState struct {
	UID      string
	Restarts int32
}

func stateOf(pod *corev1.Pod) PodState {
	state := PodState{UID: string(pod.UID)}
	if len(pod.Status.ContainerStatuses) > 0 {
		state.Restarts = pod.Status.ContainerStatuses[0].RestartCount
	}
	return state
}

// NodePodState is the node pod's state.
func (c *Cluster) NodePodState(ctx context.Context) PodState {
	ginkgo.GinkgoHelper()
	return stateOf(c.NodePod(ctx))
}

// Healthz is flexd's /healthz on the node's loopback (the scenarios run in the node's network
// namespace), answering 200.
func healthz(address string) func(context.Context) error {
	return func(ctx context.Context) error {
		request, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+address+"/healthz", nil)
		if err != nil {
			return err
		}
		client := http.Client{Timeout: 5 * time.Second}
		response, err := client.Do(request)
		if err != nil {
			return err
		}
		_ = response.Body.Close()
		if response.StatusCode != http.StatusOK {
			return fmt.Errorf("/healthz answered %s", response.Status)
		}
		return nil
	}
}

// ControllerPods are the Running replicas of the controller that are not being deleted.
func (c *Cluster) ControllerPods(ctx context.Context) []corev1.Pod {
	ginkgo.GinkgoHelper()
	pods, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=flexd-controller",
		FieldSelector: "status.phase=Running",
	})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	// Not one a rollout is deleting: its processes may be gone already.
	running := slices.DeleteFunc(pods.Items, func(pod corev1.Pod) bool { return pod.DeletionTimestamp != nil })
	gomega.Expect(running).NotTo(gomega.BeEmpty(), "a Running controller pod")
	return running
}

// ControllerLogs are the flexd logs of every Running controller replica: whichever leads
// may have served a call.
func (c *Cluster) ControllerLogs(ctx context.Context) string {
	ginkgo.GinkgoHelper()
	var logs strings.Builder
	for _, pod := range c.ControllerPods(ctx) {
		logs.WriteString(c.MustKubectl(ctx, "-n", c.Namespace, "logs", pod.Name, "-c", "flexd"))
	}
	return logs.String()
}

// ExpectControllerHardened: the controller pod as flexd's manifests harden it: its flexd
// unprivileged (CAP_CHOWN alone: no driver deployed here sets up devices in attach, the loop
// driver included) and without a ServiceAccount token, each of the sidecars (their process
// names: csi-attacher...) as uid 65532 with no capability, flexd's CSI socket for csiName 0660
// for their group 65532.
func (c *Cluster) ExpectControllerHardened(ctx context.Context, csiName string, sidecars ...string) {
	ginkgo.GinkgoHelper()
	for _, pod := range c.ControllerPods(ctx) {
		c.expectReplicaHardened(ctx, &pod, csiName, sidecars...)
	}
}

func (c *Cluster) expectReplicaHardened(ctx context.Context, pod *corev1.Pod, csiName string, sidecars ...string) {
	ginkgo.GinkgoHelper()

	pid := podProcess(string(pod.UID), "flexd", "--mode=controller")
	gomega.Expect(pid).NotTo(gomega.BeZero(), "a flexd --mode=controller in the controller pod %s", pod.Name)
	// CAP_CHOWN alone (bit 0): not privileged.
	gomega.Expect(procStatus(pid)["CapEff"]).To(gomega.Equal([]string{"0000000000000001"}), "the controller flexd's effective capabilities")

	// `test -e` answers 1 when there is no token; anything else (0: a token; no sh, no
	// container...) is not the answer looked for.
	out, err := c.Kubectl(ctx, "-n", c.Namespace, "exec", pod.Name, "-c", "flexd", "--",
		"sh", "-c", "test -e /var/run/secrets/kubernetes.io/serviceaccount/token")
	gomega.Expect(err).To(gomega.HaveOccurred(), "the controller's flexd container holds a ServiceAccount token")
	gomega.Expect(err.Error()).To(gomega.ContainSubstring("exit code 1"),
		"looking for a ServiceAccount token in the controller's flexd container failed for another reason: %s", out)

	for _, sidecar := range sidecars {
		pid := podProcess(string(pod.UID), sidecar)
		gomega.Expect(pid).NotTo(gomega.BeZero(), "no %s process in the controller pod %s", sidecar, pod.Name)
		status := procStatus(pid)
		gomega.Expect(status["Uid"]).NotTo(gomega.BeEmpty(), "%s's uids", sidecar)
		gomega.Expect(status["Uid"][0]).To(gomega.Equal("65532"), "%s's uid (of Uid: %v)", sidecar, status["Uid"])
		gomega.Expect(status["CapEff"]).To(gomega.Equal([]string{"0000000000000000"}), "%s's effective capabilities", sidecar)
	}

	// In the kubelet dir of the controller pod's node: on the host, a worker's is its own dir's.
	sock := c.NodeNamed(pod.Spec.NodeName).Path("kubelet", "pods", string(pod.UID), "volumes", "kubernetes.io~empty-dir", "socket-dir", csiName, "csi.sock")
	info, err := os.Stat(sock)
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "flexd's CSI socket in the controller pod")
	mode := info.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	gid := info.Sys().(*syscall.Stat_t).Gid
	gomega.Expect(fmt.Sprintf("%o:%d", mode, gid)).To(gomega.Equal("660:65532"), "%s's mode and group", sock)
}

// podProcess is the first process named name (its comm, as pgrep -x) in the pod's cgroup whose
// command line holds every one of args: the pod's own, not one of another cluster on the same
// host. 0 when there is none.
func podProcess(podUID, name string, args ...string) int {
	ginkgo.GinkgoHelper()
	entries, err := os.ReadDir("/proc")
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	inPod := []string{"pod" + podUID, "pod" + strings.ReplaceAll(podUID, "-", "_")}
	for _, entry := range entries {
		pid, err := strconv.Atoi(entry.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err != nil || strings.TrimSpace(string(comm)) != name {
			continue
		}
		cgroup, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil || !(strings.Contains(string(cgroup), inPod[0]) || strings.Contains(string(cgroup), inPod[1])) {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		argv := strings.Split(string(cmdline), "\x00")
		if !slices.ContainsFunc(args, func(arg string) bool { return !slices.Contains(argv, arg) }) {
			return pid
		}
	}
	return 0
}

// procStatus is /proc/PID/status, each line's fields by its key.
func procStatus(pid int) map[string][]string {
	ginkgo.GinkgoHelper()
	status := map[string][]string{}
	for _, line := range strings.Split(ReadFile(fmt.Sprintf("/proc/%d/status", pid)), "\n") {
		key, value, ok := strings.Cut(line, ":")
		if ok {
			status[key] = strings.Fields(value)
		}
	}
	return status
}

// flexd's builtin loop driver: it attaches, provisions and expands.
const (
	loopDriver  = "flexd/loop"
	loopCSIName = "flexvolume-flexd--loop"
)

// InstallLoop installs flexd's builtin loop driver on every node, its images in the nodes'
// shared dir, unless it is installed.
func (c *Cluster) InstallLoop(ctx context.Context) {
	ginkgo.GinkgoHelper()
	if !c.Installed(loopDriver) {
		c.MustFlexdEverywhere(ctx, "install", "--builtin", "loop", "--image-dir", c.SharedDir)
	}
}
