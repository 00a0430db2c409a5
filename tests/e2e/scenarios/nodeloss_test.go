package scenarios

// Node loss (issue #35; docs/oracle.md#node-loss): a worker A runs two Deployments' pods on loop
// volumes, one through flexd (a volume the loop driver provisioned, attached by csi-attacher
// through flexd's controller) and one through kubelet's and kube-controller-manager's own
// FlexVolume plugin (a FlexVolume PV of the same driver, behind the oracle's recorder). A is
// lost: every process of it killed, and it stays down (cluster.sh stop-node). The operator
// marks it out of service (the node.kubernetes.io/out-of-service taint of Kubernetes'
// non-graceful node shutdown); both volumes are detached from A by force and both pods come up
// on B with their data. Then A comes back: what it kept of the lost pods (kubelet's pod dirs,
// flexd's records) is cleaned, and B's volumes are not touched. A is the node of the controller
// replica leading csi-attacher when that replica runs on a worker, so the forced detach is also
// the other replica's fail-over. Needs E2E_NODES >= 2.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	nodeLossCSI     = "e2e-nodeloss-csi"  // Deployment, StorageClass and claim through flexd
	nodeLossFlex    = "e2e-nodeloss-flex" // Deployment, PV and claim through kubelet's FlexVolume plugin
	nodeLossRecords = "nodeloss.jsonl"    // the recorder's records, in oracleDir
	outOfService    = "node.kubernetes.io/out-of-service"
)

// nodeUp says whether the worker's processes run (cluster.sh stop-node removes its init.pid);
// node 0 is always up.
func nodeUp(node Node) bool {
	if !node.Worker() {
		return true
	}
	_, err := os.Stat(node.Path("run", "init.pid"))
	return err == nil
}

// nodeReady fails until the node's Ready condition is want.
func (c *Cluster) nodeReady(name string, want bool) func(context.Context) error {
	return func(ctx context.Context) error {
		node, err := c.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, condition := range node.Status.Conditions {
			if condition.Type == corev1.NodeReady {
				if (condition.Status == corev1.ConditionTrue) == want {
					return nil
				}
				return fmt.Errorf("node %s is Ready=%s (%s)", name, condition.Status, condition.Reason)
			}
		}
		return fmt.Errorf("node %s has no Ready condition", name)
	}
}

// flexAttachedTo fails until the nodes whose status lists the FlexVolume volume as attached
// (kube-controller-manager's attach-detach controller writes it) are exactly want.
func (c *Cluster) flexAttachedTo(volume string, want ...string) func(context.Context) error {
	return func(ctx context.Context) error {
		nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var attached []string
		for _, node := range nodes.Items {
			for _, v := range node.Status.VolumesAttached {
				if strings.Contains(string(v.Name), volume) {
					attached = append(attached, node.Name)
				}
			}
		}
		slices.Sort(attached)
		slices.Sort(want)
		if !slices.Equal(attached, want) {
			return fmt.Errorf("nodes listing %s as attached: %v, not %v", volume, attached, want)
		}
		return nil
	}
}

// recorded is one call-out the recorder recorded.
type recorded struct {
	Time    string   `json:"time"`
	Caller  string   `json:"caller"`
	Argv    []string `json:"argv"`
	MountNS string   `json:"mountNamespace"`
	Exit    int      `json:"exit"`
}

// nodeLossRecorded are the recorder's records of this scenario.
func (c *Cluster) nodeLossRecorded() []recorded {
	ginkgo.GinkgoHelper()
	var records []recorded
	for _, line := range LogLines(ReadFile(filepath.Join(c.oracleDir(), nodeLossRecords))) {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var r recorded
		gomega.Expect(json.Unmarshal([]byte(line), &r)).To(gomega.Succeed(), "a record: %s", line)
		records = append(records, r)
	}
	return records
}

// controllerManagerDetachedFrom fails until the records hold kube-controller-manager's detach
// of the volume from the node.
func (c *Cluster) controllerManagerDetachedFrom(volume, node string) func(context.Context) error {
	return func(context.Context) error {
		for _, r := range c.nodeLossRecorded() {
			if strings.Contains(r.Caller, "kube-controller-manager") && slices.Contains(r.Argv, "detach") &&
				slices.ContainsFunc(r.Argv, func(arg string) bool { return strings.Contains(arg, volume) }) &&
				slices.Contains(r.Argv, node) {
				return nil
			}
		}
		return fmt.Errorf("no detach of %s from %s by kube-controller-manager recorded yet", volume, node)
	}
}

// callsIn are the call-outs (their first argument, with the exit status when not 0) recorded in
// the mount namespace, in order.
func callsIn(records []recorded, mountNS string) []string {
	var calls []string
	for _, r := range records {
		if r.MountNS != mountNS || len(r.Argv) == 0 || r.Argv[0] == "init" {
			continue
		}
		call := r.Argv[0]
		if r.Exit != 0 {
			call += fmt.Sprintf(" (exit %d)", r.Exit)
		}
		calls = append(calls, call)
	}
	return calls
}

// mountNamespaceOf is the worker's mount namespace now (a new one each time it boots).
func mountNamespaceOf(node Node) string {
	ginkgo.GinkgoHelper()
	ns, err := os.Readlink("/proc/" + strings.TrimSpace(ReadFile(node.Path("run", "init.pid"))) + "/ns/mnt")
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "node %s's mount namespace", node.Name)
	return ns
}

// pathGone fails while the path exists.
func pathGone(path string) func(context.Context) error {
	return func(context.Context) error {
		if _, err := os.Stat(path); err == nil {
			return fmt.Errorf("%s is still there", path)
		}
		return nil
	}
}

// dirEmpty fails while the dir has an entry (a dir that is not there is empty).
func dirEmpty(dir string) func(context.Context) error {
	return func(context.Context) error {
		entries, err := os.ReadDir(dir)
		if err != nil && !os.IsNotExist(err) {
			return err
		}
		if len(entries) > 0 {
			return fmt.Errorf("%s holds %s", dir, entries[0].Name())
		}
		return nil
	}
}

// noFlexdRecordOn fails while flexd on the node holds a record naming the volume.
func (c *Cluster) noFlexdRecordOn(node Node, volume string) func(context.Context) error {
	return func(ctx context.Context) error {
		records, err := c.FlexdOn(ctx, node, "volume", "list")
		if err != nil {
			return err
		}
		if strings.Contains(records, volume) {
			return fmt.Errorf("flexd on %s still has a record of %s:\n%s", node.Name, volume, records)
		}
		return nil
	}
}

// scenarioNodeLoss: see the file's comment.
func scenarioNodeLoss(ctx context.Context) {
	c := cluster
	c.needNodes("nodeloss", 2)
	summary := c.NewSummary("nodeloss")

	ginkgo.By("flexd deployed with the loop driver, and the recorder in front of it for kubelet's own FlexVolume plugin")
	c.InstallLoop(ctx)
	gomega.Expect(os.MkdirAll(c.oracleDir(), 0o755)).To(gomega.Succeed())
	_ = os.Remove(filepath.Join(c.oracleDir(), nodeLossRecords))
	c.oracleInstall(ctx, oracleLoop, oracleLoopReal, nodeLossRecords)
	c.ApplyAllManifests(ctx, "flexd-nodeloss")
	c.WaitCSINodeLists(ctx, loopCSIName)

	// A: the node of the replica leading csi-attacher, when a worker runs it; B: another worker,
	// or node 0 with two nodes.
	leader := c.leaseHolder(ctx, "csi-attacher's leader lease for "+loopCSIName, func(lease string) bool {
		return strings.Contains(lease, "attacher") && strings.HasSuffix(lease, loopCSIName)
	})
	leaderNode := ""
	for _, pod := range c.ControllerPods(ctx) {
		if pod.Name == leader {
			leaderNode = pod.Spec.NodeName
		}
	}
	a := c.Nodes[1]
	if leaderNode != "" && c.NodeNamed(leaderNode).Worker() {
		a = c.NodeNamed(leaderNode)
	}
	b := c.Nodes[0]
	for _, node := range c.Nodes[1:] {
		if node.Name != a.Name {
			b = node
			break
		}
	}
	summary.Printf("nodeloss: A = %s, B = %s; csi-attacher's leader %s runs on %s", a.Name, b.Name, leader, leaderNode)

	ginkgo.By("a provisioned claim through flexd, and a FlexVolume PV of the same driver")
	pvCSI := c.ProvisionedLoopClaim(ctx, nodeLossCSI)
	flexImage := filepath.Join(c.SharedDir, nodeLossFlex+".img")
	// After the PV and claim are gone (cleanups run last in, first out): the image attach made.
	ginkgo.DeferCleanup(func(ctx context.Context) {
		WaitFor(ctx, 180*time.Second, nodeLossFlex+" detached everywhere", c.flexAttachedTo(nodeLossFlex))
		for _, file := range []string{flexImage, filepath.Join(c.SharedDir, "."+nodeLossFlex+".claim")} {
			if err := os.Remove(file); err != nil && !os.IsNotExist(err) {
				gomega.Expect(err).NotTo(gomega.HaveOccurred(), "removing %s", file)
			}
		}
	})
	flex := FlexSource(oracleLoop, map[string]string{"size": "64Mi"})
	flex.FlexVolume.FSType = "ext4"
	c.StaticClaim(ctx, PersistentVolume(nodeLossFlex, "64Mi", flex))
	images := map[string]string{nodeLossCSI: filepath.Join(c.SharedDir, pvCSI+".img"), nodeLossFlex: flexImage}
	volumes := map[string]string{nodeLossCSI: pvCSI, nodeLossFlex: nodeLossFlex}

	ginkgo.By("both Deployments' pods on " + a.Name + " (" + b.Name + " cordoned until they run)")
	// Whatever happens: A up again, untainted, both uncordoned, before anything is deleted.
	ginkgo.DeferCleanup(func(ctx context.Context) {
		if !nodeUp(a) {
			c.ClusterSh(ctx, "start-node", a.Name)
		}
		_, _ = c.Kubectl(ctx, "taint", "nodes", a.Name, outOfService+"-")
		for _, node := range []string{a.Name, b.Name} {
			_, err := c.Kubectl(ctx, "uncordon", node)
			gomega.Expect(err).NotTo(gomega.HaveOccurred(), "uncordoning %s", node)
		}
	})
	c.MustKubectl(ctx, "cordon", b.Name)
	for _, name := range []string{nodeLossCSI, nodeLossFlex} {
		c.CreateMovingDeployment(ctx, name, ClaimVolume(name), a.Name, b.Name)
	}
	lost := map[string]*corev1.Pod{}
	for _, name := range []string{nodeLossCSI, nodeLossFlex} {
		lost[name] = c.movingPodOn(ctx, name, a.Name, 240*time.Second)
		log := c.ScriptLog(ctx, lost[name].Name, 60*time.Second)
		gomega.Expect(LogLines(log)).To(gomega.ContainElement("first node: "+a.Name), "what the pod of %s on %s wrote", name, a.Name)
	}
	c.MustKubectl(ctx, "uncordon", b.Name)
	WaitFor(ctx, 60*time.Second, pvCSI+" attached to "+a.Name+" only", c.attachedOnlyTo(pvCSI, a.Name))
	WaitFor(ctx, 60*time.Second, nodeLossFlex+" attached to "+a.Name+" only", c.flexAttachedTo(nodeLossFlex, a.Name))
	for name, image := range images {
		gomega.Expect(c.loopClaimant(volumes[name])).To(gomega.Equal(a.Name), "the loop driver's claim of %s", volumes[name])
		WaitFor(ctx, 60*time.Second, "one loop device backing "+image+", mounted on "+a.Name+" only", c.mountedOnlyOn(image, a))
	}
	recordsOnA, err := c.FlexdOn(ctx, a, "volume", "list")
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	gomega.Expect(recordsOnA).To(gomega.ContainSubstring(pvCSI), "flexd's records on %s", a.Name)

	ginkgo.By(a.Name + " lost: every process of it killed, left down")
	c.ClusterSh(ctx, "stop-node", a.Name)
	lostAt := time.Now()
	WaitFor(ctx, 180*time.Second, a.Name+" NotReady", c.nodeReady(a.Name, false))
	notReady := time.Since(lostAt)

	ginkgo.By("the " + outOfService + " taint on " + a.Name + ": both pods come up on " + b.Name + " with their data")
	c.MustKubectl(ctx, "taint", "nodes", a.Name, outOfService+"=nodeshutdown:NoExecute")
	taintedAt := time.Now()
	moved := map[string]*corev1.Pod{}
	took := map[string]time.Duration{}
	for _, name := range []string{nodeLossCSI, nodeLossFlex} {
		moved[name] = c.movingPodOn(ctx, name, b.Name, 360*time.Second)
		took[name] = time.Since(taintedAt)
		log := c.ScriptLog(ctx, moved[name].Name, 60*time.Second)
		gomega.Expect(LogLines(log)).To(gomega.ContainElement("first node: "+a.Name), "what the pod of %s on %s read (written on %s)", name, b.Name, a.Name)
	}
	summary.Printf("nodeloss: %s NotReady %.0fs after it was lost; after the taint, Ready on %s: through flexd in %.0fs, through kubelet's FlexVolume plugin in %.0fs",
		a.Name, notReady.Seconds(), b.Name, took[nodeLossCSI].Seconds(), took[nodeLossFlex].Seconds())

	ginkgo.By("both volumes detached from " + a.Name + " by force and attached to " + b.Name + " only; one loop device each, " + b.Name + "'s")
	WaitFor(ctx, 120*time.Second, pvCSI+" attached to "+b.Name+" only", c.attachedOnlyTo(pvCSI, b.Name))
	WaitFor(ctx, 120*time.Second, nodeLossFlex+" attached to "+b.Name+" only", c.flexAttachedTo(nodeLossFlex, b.Name))
	WaitFor(ctx, 60*time.Second, "kube-controller-manager's detach of "+nodeLossFlex+" from "+a.Name, c.controllerManagerDetachedFrom(nodeLossFlex, a.Name))
	gomega.Expect(c.attachmentRecords(ctx, pvCSI)).To(gomega.Equal(1), "flexd's attachment records of %s (%s's only)", pvCSI, b.Name)
	for name, image := range images {
		gomega.Expect(c.loopClaimant(volumes[name])).To(gomega.Equal(b.Name), "the loop driver's claim of %s", volumes[name])
		WaitFor(ctx, 60*time.Second, "one loop device backing "+image+", mounted on "+b.Name+" only", c.mountedOnlyOn(image, b))
	}
	// The replica that ran on A, if one did, is replaced on a node that is up.
	WaitFor(ctx, 180*time.Second, "two Running controller replicas, none on "+a.Name, func(ctx context.Context) error {
		var on []string
		for _, pod := range c.ControllerPods(ctx) {
			on = append(on, pod.Spec.NodeName)
		}
		if len(on) != 2 || slices.Contains(on, a.Name) {
			return fmt.Errorf("Running controller replicas on %v", on)
		}
		return nil
	})
	devices := map[string][]string{}
	for name, image := range images {
		devices[name] = loopDevicesOf(ctx, image)
	}

	ginkgo.By(a.Name + " back: kubelet's pod dirs and flexd's records of the lost pods cleaned, " + b.Name + "'s volumes untouched")
	before := len(c.nodeLossRecorded())
	c.ClusterSh(ctx, "start-node", a.Name)
	backAt := time.Now()
	c.MustKubectl(ctx, "taint", "nodes", a.Name, outOfService+"-")
	for name, pod := range lost {
		WaitFor(ctx, 180*time.Second, "kubelet on "+a.Name+" to remove the dir of the lost pod of "+name,
			pathGone(a.Path("kubelet", "pods", string(pod.UID))))
	}
	WaitFor(ctx, 120*time.Second, "flexd on "+a.Name+" to drop its records of "+pvCSI, c.noFlexdRecordOn(a, pvCSI))
	// Nothing staged on A by either path: kubelet's device mount dirs of both drivers are empty.
	WaitFor(ctx, 60*time.Second, "no staging dir of "+loopCSIName+" on "+a.Name,
		dirEmpty(a.Path("kubelet", "plugins", "kubernetes.io", "csi", loopCSIName)))
	WaitFor(ctx, 60*time.Second, "no device mount dir of "+oracleLoop+" on "+a.Name,
		dirEmpty(a.Path("kubelet", "plugins", "kubernetes.io", "flexvolume", oracleLoop, "mounts")))
	cleaned := time.Since(backAt)
	for name, image := range images {
		gomega.Expect(loopDevicesOf(ctx, image)).To(gomega.Equal(devices[name]), "the loop devices backing %s", image)
		gomega.Expect(c.mountedOnlyOn(image, b)(ctx)).To(gomega.Succeed())
		gomega.Expect(c.loopClaimant(volumes[name])).To(gomega.Equal(b.Name), "the loop driver's claim of %s", volumes[name])
		pod := c.GetPod(ctx, moved[name].Name)
		gomega.Expect(PodReady(pod)).To(gomega.BeTrue(), "pod %s on %s Ready", pod.Name, b.Name)
		out := c.MustKubectl(ctx, "exec", pod.Name, "--", "sh", "-c", "echo after > /data/after && cat /data/first-node /data/after")
		gomega.Expect(out).To(gomega.Equal(a.Name+"\nafter\n"), "what pod %s writes and reads on %s", pod.Name, b.Name)
	}
	gomega.Expect(c.attachedOnlyTo(pvCSI, b.Name)(ctx)).To(gomega.Succeed())
	gomega.Expect(c.flexAttachedTo(nodeLossFlex, b.Name)(ctx)).To(gomega.Succeed())
	calls := callsIn(c.nodeLossRecorded()[before:], mountNamespaceOf(a))
	summary.Printf("nodeloss: %s back; its lost pods' dirs and flexd's records gone %.0fs after it was Ready", a.Name, cleaned.Seconds())
	summary.Printf("nodeloss: kubelet's FlexVolume plugin on %s, back, called the driver: %v", a.Name, calls)
}
