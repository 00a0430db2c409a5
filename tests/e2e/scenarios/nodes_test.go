package scenarios

// A volume that moves between nodes (issue #35): a Deployment's pod on a loop volume (the loop
// driver through flexd's CSI, attached by csi-attacher) on one worker, that worker drained, the
// pod again on another node with its data. Needs E2E_NODES >= 2.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

const nodesName = "e2e-nodes"

// movingDeployment is the Deployment NAME: one pod on the claim, on node A or B only (its
// affinity): it writes the name of the node it first ran on to the volume unless the volume has
// it, and prints it.
func (c *Cluster) movingDeployment(name string, volume corev1.VolumeSource, a, b string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	pod := c.ToolsPodOn(a, name, `[ -s /data/first-node ] || echo "$NODE_NAME" > /data/first-node; echo "first node: $(cat /data/first-node)"`,
		volume, nil)
	pod.Spec.NodeSelector = nil
	pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{a, b}}},
		}}},
	}}
	pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"},
	}}}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			// One pod at a time: the volume is ReadWriteOnce.
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: pod.Spec},
		},
	}
}

// movingPodOn waits until the Deployment NAME's one pod is Ready on the node (and no other pod
// of it is left), and returns it.
func (c *Cluster) movingPodOn(ctx context.Context, name, node string, timeout time.Duration) *corev1.Pod {
	ginkgo.GinkgoHelper()
	var ready *corev1.Pod
	WaitFor(ctx, timeout, "the pod of "+name+" Ready on "+node, func(ctx context.Context) error {
		pods, err := c.Kube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		if err != nil {
			return err
		}
		var seen []string
		for i := range pods.Items {
			pod := &pods.Items[i]
			seen = append(seen, fmt.Sprintf("%s on %q: %s ready=%v", pod.Name, pod.Spec.NodeName, pod.Status.Phase, PodReady(pod)))
		}
		if len(pods.Items) != 1 || pods.Items[0].Spec.NodeName != node || !PodReady(&pods.Items[0]) {
			return fmt.Errorf("pods: %v", seen)
		}
		ready = &pods.Items[0]
		return nil
	})
	return ready
}

// attachedNodes are the nodes the PV has a VolumeAttachment for, with its attached status.
func (c *Cluster) attachedNodes(ctx context.Context, pv string) (map[string]bool, error) {
	attachments, err := c.Kube.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	nodes := map[string]bool{}
	for _, attachment := range attachments.Items {
		if name := attachment.Spec.Source.PersistentVolumeName; name != nil && *name == pv {
			nodes[attachment.Spec.NodeName] = attachment.Status.Attached
		}
	}
	return nodes, nil
}

// attachedOnlyTo fails until the PV's one VolumeAttachment is the node's, attached.
func (c *Cluster) attachedOnlyTo(pv, node string) func(context.Context) error {
	return func(ctx context.Context) error {
		nodes, err := c.attachedNodes(ctx, pv)
		if err != nil {
			return err
		}
		if len(nodes) != 1 || !nodes[node] {
			return fmt.Errorf("VolumeAttachments of %s (node: attached): %v", pv, nodes)
		}
		return nil
	}
}

// loopDevicesOf are the loop devices on the host (the kernel's, every node's) backed by the
// file, matched by device and inode as cluster.sh's down does: the path the kernel shows is
// the one the node's mount namespace opened it by.
func loopDevicesOf(ctx context.Context, file string) []string {
	ginkgo.GinkgoHelper()
	info, err := os.Stat(file)
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "the image %s", file)
	stat := info.Sys().(*syscall.Stat_t)
	device := fmt.Sprintf("%d:%d", unixMajor(uint64(stat.Dev)), unixMinor(uint64(stat.Dev)))
	out := MustRun(ctx, "losetup", "--list", "--noheadings", "--output", "NAME,BACK-MAJ:MIN,BACK-INO")
	var devices []string
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(line)
		if len(fields) == 3 && fields[1] == device && fields[2] == fmt.Sprint(stat.Ino) {
			devices = append(devices, fields[0])
		}
	}
	return devices
}

func unixMajor(dev uint64) uint64 { return (dev>>8)&0xfff | (dev>>32)&^0xfff }
func unixMinor(dev uint64) uint64 { return dev&0xff | (dev>>12)&^0xff }

// MountSourcesOn are the sources (the device, for a block filesystem) of the mounts visible in
// the node's mount namespace, one per mount. A worker's namespace also holds copies of node 0's
// mounts under the dirs its own are mounted over (it is a slave of the host's), hidden by its
// own: those are not its mounts, and are left out.
func MountSourcesOn(node Node) []string {
	ginkgo.GinkgoHelper()
	path := "/proc/self/mountinfo"
	if node.Worker() {
		path = "/proc/" + strings.TrimSpace(ReadFile(node.Path("run", "init.pid"))) + "/mountinfo"
	}
	type mount struct{ id, parent, target, source string }
	var mounts []mount
	byID := map[string]mount{}
	for _, line := range strings.Split(ReadFile(path), "\n") {
		// ID PARENT MAJ:MIN ROOT TARGET OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER-OPTIONS
		before, after, ok := strings.Cut(line, " - ")
		fields, tail := strings.Fields(before), strings.Fields(after)
		if !ok || len(fields) < 5 || len(tail) < 2 {
			continue
		}
		m := mount{id: fields[0], parent: fields[1], target: unescapeMountinfo(fields[4]), source: unescapeMountinfo(tail[1])}
		mounts = append(mounts, m)
		byID[m.id] = m
	}
	under := func(path, dir string) bool {
		return path == dir || dir == "/" || strings.HasPrefix(path, dir+"/")
	}
	var sources []string
	for _, m := range mounts {
		ancestors := map[string]bool{m.id: true}
		for p, ok := byID[m.parent]; ok && !ancestors[p.id]; p, ok = byID[p.parent] {
			ancestors[p.id] = true
		}
		// Hidden when another mount, not one it is mounted on, covers its mount point.
		hidden := slices.ContainsFunc(mounts, func(other mount) bool {
			return !ancestors[other.id] && under(m.target, other.target) && other.target != "/"
		})
		if !hidden {
			sources = append(sources, m.source)
		}
	}
	return sources
}

// mountedOnlyOn fails until exactly one loop device backs the image and the node mounts it,
// and no other node mounts a loop device of the image (a worker that is down mounts nothing).
func (c *Cluster) mountedOnlyOn(image string, node Node) func(context.Context) error {
	return func(ctx context.Context) error {
		devices := loopDevicesOf(ctx, image)
		if len(devices) != 1 {
			return fmt.Errorf("loop devices backed by %s: %v (one expected)", image, devices)
		}
		for _, other := range c.Nodes {
			if !nodeUp(other) {
				continue
			}
			mounts := MountSourcesOn(other)
			if other.Name == node.Name && !slices.Contains(mounts, devices[0]) {
				return fmt.Errorf("node %s does not mount %s (backed by %s)", other.Name, devices[0], image)
			}
			if other.Name != node.Name && slices.Contains(mounts, devices[0]) {
				return fmt.Errorf("node %s mounts %s (backed by %s) too", other.Name, devices[0], image)
			}
		}
		return nil
	}
}

// ProvisionedLoopClaim is the claim NAME of a StorageClass NAME of the loop driver, Bound; it
// returns the PV's name. When the scenario ends the claim is deleted (after its pods: cleanups
// run last in, first out) and the loop driver deletes the volume, then the class goes.
func (c *Cluster) ProvisionedLoopClaim(ctx context.Context, name string) string {
	ginkgo.GinkgoHelper()
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: loopCSIName}
	_, err := c.Kube.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating the StorageClass %s", name)
	ginkgo.DeferCleanup(func(ctx context.Context) {
		err := c.Kube.StorageV1().StorageClasses().Delete(ctx, name, metav1.DeleteOptions{})
		if !apierrors.IsNotFound(err) {
			gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting the StorageClass %s", name)
		}
	})
	c.CreateClaim(ctx, name, name, "64Mi")
	var pv string
	ginkgo.DeferCleanup(func(ctx context.Context) {
		c.DeleteClaimIfThere(ctx, name)
		if pv == "" {
			return
		}
		WaitFor(ctx, 180*time.Second, "the provisioned volume "+pv+" to be deleted", func(ctx context.Context) error {
			_, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("PV %s is still there (%v)", pv, err)
		})
	})
	c.WaitClaimBound(ctx, name, 180*time.Second)
	bound, err := c.Kube.CoreV1().PersistentVolumeClaims(podNamespace).Get(ctx, name, metav1.GetOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	pv = bound.Spec.VolumeName
	return pv
}

// CreateMovingDeployment creates movingDeployment NAME; when the scenario ends it is deleted
// and its pods are waited out.
func (c *Cluster) CreateMovingDeployment(ctx context.Context, name string, volume corev1.VolumeSource, a, b string) {
	ginkgo.GinkgoHelper()
	_, err := c.Kube.AppsV1().Deployments(podNamespace).Create(ctx, c.movingDeployment(name, volume, a, b), metav1.CreateOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating the Deployment %s", name)
	ginkgo.DeferCleanup(func(ctx context.Context) {
		_, err := c.Kubectl(ctx, "delete", "deployment", name, "--ignore-not-found", "--wait=true", "--timeout=180s")
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting the Deployment %s", name)
		WaitFor(ctx, 180*time.Second, "the pods of "+name+" to go", func(ctx context.Context) error {
			pods, err := c.Kube.CoreV1().Pods(podNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
			if err != nil {
				return err
			}
			if len(pods.Items) > 0 {
				return fmt.Errorf("%d pods left", len(pods.Items))
			}
			return nil
		})
	})
}

// needNodes skips the scenario, saying why, on a cluster of fewer nodes.
func (c *Cluster) needNodes(scenario string, nodes int) {
	if len(c.Nodes) < nodes {
		ginkgo.Skip(fmt.Sprintf("%s: needs at least %d nodes, the cluster has %d (E2E_NODES=3 tests/e2e/run.sh)", scenario, nodes, len(c.Nodes)))
	}
}

// twoNodes are the nodes a volume moves between: worker A (node 1) and B, another worker, or
// node 0 on two nodes. The scenario is skipped on one node.
func (c *Cluster) twoNodes(scenario string) (Node, Node) {
	c.needNodes(scenario, 2)
	if len(c.Nodes) > 2 {
		return c.Nodes[1], c.Nodes[2]
	}
	return c.Nodes[1], c.Nodes[0]
}

// scenarioNodes: a loop volume provisioned and attached to a worker A, where a Deployment's pod
// writes to it; A drained: the pod comes up on B (another worker, or node 0 with two nodes) with
// the data A's pod wrote, A's VolumeAttachment goes, and the one loop device backing the image
// on the host is the one B mounts.
func scenarioNodes(ctx context.Context) {
	c := cluster
	a, b := c.twoNodes("nodes")

	ginkgo.By("flexd deployed with the builtin loop driver, on every node, and its controller")
	c.InstallLoop(ctx)
	c.ApplyAllManifests(ctx, "flexd-nodes")
	c.WaitCSINodeLists(ctx, loopCSIName)

	ginkgo.By("a claim of a StorageClass of the loop driver, provisioned")
	pv := c.ProvisionedLoopClaim(ctx, nodesName)
	image := filepath.Join(c.SharedDir, pv+".img")

	ginkgo.By("a Deployment's pod on the claim, on " + a.Name + " (" + b.Name + " cordoned until it runs)")
	// Uncordoned whatever happens, before anything else is deleted.
	ginkgo.DeferCleanup(func(ctx context.Context) {
		for _, node := range []string{a.Name, b.Name} {
			_, err := c.Kubectl(ctx, "uncordon", node)
			gomega.Expect(err).NotTo(gomega.HaveOccurred(), "uncordoning %s", node)
		}
	})
	c.MustKubectl(ctx, "cordon", b.Name)
	c.CreateMovingDeployment(ctx, nodesName, ClaimVolume(nodesName), a.Name, b.Name)
	first := c.movingPodOn(ctx, nodesName, a.Name, 240*time.Second)
	c.MustKubectl(ctx, "uncordon", b.Name)
	log := c.ScriptLog(ctx, first.Name, 60*time.Second)
	gomega.Expect(LogLines(log)).To(gomega.ContainElement("first node: "+a.Name), "what the pod on %s wrote", a.Name)
	WaitFor(ctx, 60*time.Second, pv+" attached to "+a.Name+" only", c.attachedOnlyTo(pv, a.Name))
	WaitFor(ctx, 60*time.Second, "one loop device backing "+image+", mounted on "+a.Name+" only", c.mountedOnlyOn(image, a))

	ginkgo.By("draining " + a.Name + ": the pod comes up on " + b.Name + " with its data")
	c.MustKubectl(ctx, "drain", a.Name, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=300s")
	second := c.movingPodOn(ctx, nodesName, b.Name, 300*time.Second)
	gomega.Expect(second.UID).NotTo(gomega.Equal(first.UID), "a new pod")
	log = c.ScriptLog(ctx, second.Name, 60*time.Second)
	gomega.Expect(LogLines(log)).To(gomega.ContainElement("first node: "+a.Name), "what the pod on %s read (written on %s)", b.Name, a.Name)
	gomega.Expect(ReadFileInPod(ctx, c, second.Name, "/data/first-node")).To(gomega.Equal(a.Name + "\n"))

	ginkgo.By("the VolumeAttachment for " + a.Name + " gone, " + b.Name + "'s attached; one loop device, " + b.Name + "'s")
	WaitFor(ctx, 120*time.Second, pv+" attached to "+b.Name+" only", c.attachedOnlyTo(pv, b.Name))
	WaitFor(ctx, 60*time.Second, "one loop device backing "+image+", mounted on "+b.Name+" only", c.mountedOnlyOn(image, b))
}
