package scenarios

// The faults: flexd's node pod deleted while pods with volumes start, kubelet killed and started
// again, the node restarted. The three share E2E_FAULT_PODS (default 10) pods, each with an
// inline volume of its own: faults_pod makes them, faults_kubelet and faults_node reuse them
// (each makes them first when it runs without the ones before it).
//
// Who deletes the fault pods. They outlive the spec that makes them, so they cannot be made by
// CreatePod (whose cleanup is the spec's), and the shared Ordered container has no AfterAll for
// three of its specs alone (one on the container would run after storage and the oracle, which
// must not find ten more volumes on the node). So each fault spec registers, at its start, a
// cleanup of its own (DeferCleanup, run when the spec ends, passed or failed) that deletes the
// fault pods when the spec failed (the next fault spec then starts from fresh pods rather than
// from whatever the failure left) or when no later fault spec is selected to run (the label
// filter, --focus and --skip, as run.sh's E2E_SCENARIOS makes them): so they are gone at the
// latest when the last of the three that runs ends, and never linger into the scenarios after.
// faults_node, the last, also deletes them in its body, as a step whose outcome it checks.

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The fault scenarios in the order they run.
var faultScenarios = []string{"faults_pod", "faults_kubelet", "faults_node"}

// faultPodCount is E2E_FAULT_PODS, default 10.
func faultPodCount() int {
	ginkgo.GinkgoHelper()
	value := os.Getenv("E2E_FAULT_PODS")
	if value == "" {
		return 10
	}
	n, err := strconv.Atoi(value)
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "E2E_FAULT_PODS=%s", value)
	gomega.Expect(n).To(gomega.BeNumerically(">", 0), "E2E_FAULT_PODS")
	return n
}

func faultPodName(i int) string { return fmt.Sprintf("e2e-fault-%d", i) }

// faultPodRead is what fault pod i reads from its volume: the driver's mount wrote it.
func faultPodRead(i int) string { return fmt.Sprintf("hostdir e2e-fault-%d fault %d", i, i) }

// faultPod is fault pod i: an inline volume of its own, which it reads.
func (c *Cluster) faultPod(i int) *corev1.Pod {
	volume := InlineCSIVolume(c.CSIName, map[string]string{"volume": fmt.Sprintf("e2e-fault-%d", i), "greeting": fmt.Sprintf("fault %d", i)})
	return c.ToolsPod(faultPodName(i), "cat /data/driver", volume, nil)
}

// createFaultPod creates fault pod i, not waiting for it; its deletion is the fault specs'
// (see the top of this file), not the spec's that made it.
func (c *Cluster) createFaultPod(ctx context.Context, i int) {
	ginkgo.GinkgoHelper()
	pod := c.faultPod(i)
	_, err := c.Kube.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating pod %s", pod.Name)
}

// selectedToRun says whether the scenario's spec is selected by this run's filters: the label
// filter (run.sh's E2E_SCENARIOS), --focus and --skip on the spec's text.
func selectedToRun(name string) bool {
	ginkgo.GinkgoHelper()
	config, _ := ginkgo.GinkgoConfiguration()
	filter, err := types.ParseLabelFilter(config.LabelFilter)
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "the label filter %q", config.LabelFilter)
	if !filter([]string{name}) {
		return false
	}
	text := "flexd " + name
	matches := func(patterns []string) bool {
		for _, pattern := range patterns {
			if regexp.MustCompile(pattern).MatchString(text) {
				return true
			}
		}
		return false
	}
	return (len(config.FocusStrings) == 0 || matches(config.FocusStrings)) && !matches(config.SkipStrings)
}

// deleteFaultPodsWhenDone is the cleanup each fault spec registers first (see the top of this
// file): the fault pods deleted when the spec failed or no later fault spec runs.
func (c *Cluster) deleteFaultPodsWhenDone(name string) {
	ginkgo.DeferCleanup(func(ctx context.Context) {
		later := false
		for i, scenario := range faultScenarios {
			if scenario == name {
				for _, next := range faultScenarios[i+1:] {
					later = later || selectedToRun(next)
				}
			}
		}
		if ginkgo.CurrentSpecReport().Failed() || !later {
			ginkgo.By("deleting the fault pods")
			c.deleteFaultPods(ctx)
		}
	})
}

// deleteFaultPods deletes every fault pod there is and waits until they are gone (kubelet
// deletes a pod once its volumes are unmounted).
func (c *Cluster) deleteFaultPods(ctx context.Context) {
	ginkgo.GinkgoHelper()
	n := faultPodCount()
	for i := 1; i <= n; i++ {
		err := c.Kube.CoreV1().Pods(podNamespace).Delete(ctx, faultPodName(i), metav1.DeleteOptions{})
		if !apierrors.IsNotFound(err) {
			gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting pod %s", faultPodName(i))
		}
	}
	for i := 1; i <= n; i++ {
		c.waitPodGone(ctx, faultPodName(i), 180*time.Second)
	}
}

// ensureFaultPods makes the fault pods that are not there (a fault spec run without the ones
// before it) and waits for them as faults_pod does.
func (c *Cluster) ensureFaultPods(ctx context.Context) {
	ginkgo.GinkgoHelper()
	missing := 0
	for i := 1; i <= faultPodCount(); i++ {
		_, err := c.Kube.CoreV1().Pods(podNamespace).Get(ctx, faultPodName(i), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			c.createFaultPod(ctx, i)
			missing++
			continue
		}
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "getting pod %s", faultPodName(i))
	}
	if missing > 0 {
		ginkgo.By(fmt.Sprintf("%d fault pods were not there (faults_pod did not run before): made them", missing))
		c.expectFaultPodsOK(ctx, 300*time.Second)
	}
}

// expectFaultPodsOK: every fault pod Ready within timeout and its script done, reading its own
// data (its log, and its container now), its volume mounted once on its target, flexd holding
// one record of it; and nothing else: exactly the fault pods' volumes mounted in kubelet's dir
// and recorded.
func (c *Cluster) expectFaultPodsOK(ctx context.Context, timeout time.Duration) {
	ginkgo.GinkgoHelper()
	n := faultPodCount()
	for i := 1; i <= n; i++ {
		name := faultPodName(i)
		log := c.PodScriptLog(ctx, name, timeout)
		gomega.Expect(LogLines(log)).To(gomega.ContainElement(faultPodRead(i)), "pod %s's log: what the driver's mount wrote", name)
		WaitFor(ctx, timeout, "pod "+name+"'s container to read its volume", func(ctx context.Context) error {
			out, err := c.Kubectl(ctx, "exec", name, "--", "cat", "/data/driver")
			if err != nil {
				return err
			}
			if strings.TrimSuffix(out, "\n") != faultPodRead(i) {
				return fmt.Errorf("it reads %q, not %q", out, faultPodRead(i))
			}
			return nil
		})
		target := c.VolumeTarget(c.PodUID(ctx, name), "data")
		gomega.Expect(MountCount(target)).To(gomega.Equal(1), "mounts of %s (pod %s's volume)", target, name)
		records := c.VolumeRecords(ctx)
		gomega.Expect(recordLines(records, target)).To(gomega.HaveLen(1), "flexd's records of %s (pod %s's volume), in:\n%s", target, name, records)
	}
	csiMounts := c.csiVolumeMounts()
	gomega.Expect(csiMounts).To(gomega.HaveLen(n), "CSI volume mounts in kubelet's dir: exactly the %d fault pods'", n)
	records := c.VolumeRecords(ctx)
	gomega.Expect(recordCount(records)).To(gomega.Equal(n), "flexd's records: exactly the %d fault pods', in:\n%s", n, records)
}

// csiVolumeMounts are the mounts of CSI volumes in kubelet's pods dir.
func (c *Cluster) csiVolumeMounts() []string {
	ginkgo.GinkgoHelper()
	pattern := regexp.MustCompile("^" + regexp.QuoteMeta(c.Path("kubelet", "pods")) + "/.*/volumes/kubernetes\\.io~csi/")
	var found []string
	for _, target := range Mounts() {
		if pattern.MatchString(target) {
			found = append(found, target)
		}
	}
	return found
}

// recordCount is how many records `flexd volume list` lists (its lines after the header).
func recordCount(records string) int {
	lines := LogLines(records)
	if len(lines) <= 1 {
		return 0
	}
	return len(lines) - 1
}

// faultStates are the fault pods' states (UID, restart count), in order.
func (c *Cluster) faultStates(ctx context.Context) []PodState {
	ginkgo.GinkgoHelper()
	var states []PodState
	for i := 1; i <= faultPodCount(); i++ {
		pod, err := c.Kube.CoreV1().Pods(podNamespace).Get(ctx, faultPodName(i), metav1.GetOptions{})
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "getting pod %s", faultPodName(i))
		states = append(states, stateOf(pod))
	}
	return states
}

// saveFaultStates writes the states to run/NAME (kept with a failed run's logs).
func (c *Cluster) saveFaultStates(name string, states []PodState) {
	ginkgo.GinkgoHelper()
	var b strings.Builder
	for _, state := range states {
		fmt.Fprintf(&b, "%s %d\n", state.UID, state.Restarts)
	}
	c.WriteRun(name, b.String())
}

// scenarioFaultsPod: the node pod deleted while the fault pods start (half before, half after):
// a new node pod rolls out and every fault pod runs with its own data.
func scenarioFaultsPod(ctx context.Context) {
	c := cluster
	c.deleteFaultPodsWhenDone("faults_pod")
	n := faultPodCount()
	before := c.NodePodState(ctx)
	ginkgo.By(fmt.Sprintf("fault pods 1 to %d, then the node pod deleted, then pods %d to %d", n/2, n/2+1, n))
	for i := 1; i <= n/2; i++ {
		c.createFaultPod(ctx, i)
	}
	nodePod := c.NodePod(ctx)
	gomega.Expect(c.Kube.CoreV1().Pods(c.Namespace).Delete(ctx, nodePod.Name, metav1.DeleteOptions{})).
		To(gomega.Succeed(), "deleting the node pod %s", nodePod.Name)
	for i := n/2 + 1; i <= n; i++ {
		c.createFaultPod(ctx, i)
	}

	ginkgo.By("waiting for a new node pod and its rollout")
	WaitFor(ctx, 120*time.Second, "a new node pod (the old one "+before.UID+" gone)", func(ctx context.Context) error {
		pods, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=flexd-node"})
		if err != nil {
			return err
		}
		var uids []string
		for _, pod := range pods.Items {
			uids = append(uids, string(pod.UID))
		}
		if len(uids) == 0 || strings.Contains(strings.Join(uids, " "), before.UID) {
			return fmt.Errorf("the node pods are %v", uids)
		}
		return nil
	})
	c.MustKubectl(ctx, "-n", c.Namespace, "rollout", "status", "daemonset/flexd-node", "--timeout=240s")

	ginkgo.By("every fault pod running with its own data")
	c.expectFaultPodsOK(ctx, 300*time.Second)
	c.saveFaultStates("fault-states", c.faultStates(ctx))
}

// scenarioFaultsKubelet: kubelet killed and started again: the fault pods keep running with
// their volumes (the same pods, no container restart, mounted once, readable), and a new pod
// mounts.
func scenarioFaultsKubelet(ctx context.Context) {
	c := cluster
	c.deleteFaultPodsWhenDone("faults_kubelet")
	c.ensureFaultPods(ctx)
	before := c.faultStates(ctx)
	c.saveFaultStates("fault-states-before-kubelet", before)

	ginkgo.By("kubelet killed and started again")
	c.ClusterSh(ctx, "restart-kubelet")

	ginkgo.By("the same fault pods, no container restarted, each with its volume")
	gomega.Expect(c.faultStates(ctx)).To(gomega.Equal(before), "the fault pods' (UID, restarts) after kubelet's restart")
	c.expectFaultPodsOK(ctx, 120*time.Second)

	ginkgo.By("a new pod mounts")
	volume := InlineCSIVolume(c.CSIName, map[string]string{"volume": "e2e-after-kubelet", "greeting": "after kubelet"})
	log := c.RunPod(ctx, c.ToolsPod("e2e-after-kubelet", "cat /data/driver", volume, nil), 180*time.Second)
	gomega.Expect(LogLines(log)).To(gomega.ContainElement("hostdir e2e-after-kubelet after kubelet"), "what the driver's mount wrote")
	target := c.VolumeTarget(c.PodUID(ctx, "e2e-after-kubelet"), "data")
	gomega.Expect(MountCount(target)).To(gomega.BeNumerically(">", 0), "%s is not mounted", target)
	c.DeletePod(ctx, "e2e-after-kubelet")
	c.ExpectUnpublished(ctx, target)
}

// scenarioFaultsNode: the node restarted (every process of the cluster killed, containers too,
// every mount under the scratch dir and the cgroups gone, everything started again): the node
// pod rolls out, kubelet lists the driver, every fault pod's container is a new one with its
// data, each volume mounted once and recorded once, no process from before the restart; then
// the pods go and leave no mount or record.
func scenarioFaultsNode(ctx context.Context) {
	c := cluster
	c.deleteFaultPodsWhenDone("faults_node")
	c.ensureFaultPods(ctx)
	before := c.faultStates(ctx)
	c.saveFaultStates("fault-states-before-restart", before)
	booted := nowTicks(ctx)

	ginkgo.By("the node restarted")
	c.ClusterSh(ctx, "restart-node")

	ginkgo.By("the node pod rolls out, kubelet lists the driver")
	c.MustKubectl(ctx, "-n", c.Namespace, "rollout", "status", "daemonset/flexd-node", "--timeout=240s")
	c.WaitCSINodeLists(ctx, c.CSIName)

	ginkgo.By("every fault pod's container started again, with its volume")
	WaitFor(ctx, 300*time.Second, "every fault pod's container to start again", func(ctx context.Context) error {
		for i, was := range before {
			pod, err := c.Kube.CoreV1().Pods(podNamespace).Get(ctx, faultPodName(i+1), metav1.GetOptions{})
			if err != nil {
				return err
			}
			now := stateOf(pod)
			if now.UID != was.UID || now.Restarts <= was.Restarts {
				return fmt.Errorf("pod %s is (UID %s, %d restarts), was (%s, %d): not the same pod restarted", pod.Name, now.UID, now.Restarts, was.UID, was.Restarts)
			}
		}
		return nil
	})
	c.expectFaultPodsOK(ctx, 300*time.Second)

	ginkgo.By("no process of the cluster from before the restart")
	expectNoProcessBefore(ctx, booted)

	ginkgo.By("the fault pods deleted: no mount, no record left")
	var targets []string
	for i := 1; i <= len(before); i++ {
		targets = append(targets, c.VolumeTarget(c.PodUID(ctx, faultPodName(i)), "data"))
	}
	c.deleteFaultPods(ctx)
	for _, target := range targets {
		c.ExpectUnpublished(ctx, target)
	}
	gomega.Expect(c.csiVolumeMounts()).To(gomega.BeEmpty(), "CSI volume mounts left in kubelet's dir")
	records := c.VolumeRecords(ctx)
	gomega.Expect(recordCount(records)).To(gomega.Equal(0), "flexd's records left:\n%s", records)
}

// nowTicks is the time since boot in clock ticks, as /proc/PID/stat's starttime counts it.
func nowTicks(ctx context.Context) uint64 {
	ginkgo.GinkgoHelper()
	hz, err := strconv.ParseUint(strings.TrimSpace(MustRun(ctx, "getconf", "CLK_TCK")), 10, 64)
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "getconf CLK_TCK")
	uptime, err := strconv.ParseFloat(strings.Fields(ReadFile("/proc/uptime"))[0], 64)
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "/proc/uptime")
	return uint64(uptime * float64(hz))
}

// startTicks is a process's starttime (field 22 of /proc/PID/stat); false when it is gone.
func startTicks(pid int) (uint64, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// Field 2, the command in parentheses, may hold spaces: count from after its ')'.
	stat := string(data)
	fields := strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:])
	if len(fields) < 20 {
		return 0, false
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	return start, err == nil
}

// parentPid is a process's parent (field 4 of /proc/PID/stat); 0 when it is gone.
func parentPid(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	stat := string(data)
	fields := strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:])
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

// ours says whether pid is this test process or one of its children (the scenarios run in the
// cluster's network namespace, and so do the commands they run): not the cluster's.
func ours(pid int) bool {
	self := os.Getpid()
	for p := pid; p > 1; p = parentPid(p) {
		if p == self {
			return true
		}
	}
	return false
}

// expectNoProcessBefore: every process in the cluster's network namespace (E2E_NAME), but this
// test's own, started after ticks (clock ticks since boot): none survived the restart.
func expectNoProcessBefore(ctx context.Context, ticks uint64) {
	ginkgo.GinkgoHelper()
	var old []string
	checked := 0
	for _, field := range strings.Fields(MustRun(ctx, "ip", "netns", "pids", env("E2E_NAME"))) {
		pid, err := strconv.Atoi(field)
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "a pid of `ip netns pids`: %q", field)
		start, alive := startTicks(pid)
		if !alive || ours(pid) {
			continue
		}
		checked++
		if start >= ticks {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		old = append(old, fmt.Sprintf("%d (started at tick %d): %s", pid, start, strings.ReplaceAll(string(cmdline), "\x00", " ")))
	}
	gomega.Expect(checked).To(gomega.BeNumerically(">", 0), "processes of the cluster in netns %s", env("E2E_NAME"))
	gomega.Expect(old).To(gomega.BeEmpty(), "processes of the cluster from before the restart (tick %d)", ticks)
}
