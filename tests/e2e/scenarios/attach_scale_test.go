package scenarios

// The attach bench (bench/attach-scale.sh; not in the suite's run): many nodes without kubelets,
// Node and CSINode objects made through the API as kwok and kubemark make them, and M volumes
// of an attaching driver attached across them by kube-controller-manager's attach/detach
// controller, then detached. Once through its own FlexVolume attach, once through the CSI path
// (csi-attacher and flexd's controller), the same driver (tests/e2e/drivers/attachbench),
// measured the same way: from the pods' creation (or deletion) to the nodes' status listing
// every volume attached (or none).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	"golang.org/x/sync/errgroup"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

const (
	benchDriver  = "e2e/attachbench"
	benchCSIName = "flexvolume-e2e--attachbench"
	// The label of every object the bench makes, and the taint that keeps every other pod
	// (flexd's DaemonSet, its controller) off the nodes without kubelets.
	benchLabel = "flexd-bench-attach-scale"
)

// attachPath is one way a volume gets attached: its name in the report and its PV source.
type attachPath struct {
	name   string
	source func(volume string) corev1.PersistentVolumeSource
}

// processUsage is the CPU time (seconds) and peak RSS (bytes) of the host's processes whose
// command line holds every word.
func processUsage(words ...string) (cpu float64, peak int64, count int) {
	entries, _ := os.ReadDir("/proc")
	for _, entry := range entries {
		if _, err := strconv.Atoi(entry.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", entry.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		matches := true
		for _, word := range words {
			if !containsWord(args, word) {
				matches = false
			}
		}
		if !matches {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", entry.Name(), "stat"))
		if err != nil {
			continue
		}
		// After the command's name in parentheses: field 14 and 15 are utime and stime.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		utime, _ := strconv.ParseFloat(fields[11], 64)
		stime, _ := strconv.ParseFloat(fields[12], 64)
		cpu += (utime + stime) / 100 // USER_HZ
		status, _ := os.ReadFile(filepath.Join("/proc", entry.Name(), "status"))
		for _, line := range strings.Split(string(status), "\n") {
			if kb, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(kb), " kB"), 10, 64)
				peak = max(peak, n*1024)
			}
		}
		count++
	}
	return cpu, peak, count
}

func containsWord(args []string, word string) bool {
	for _, arg := range args {
		if arg == word || strings.HasSuffix(arg, "/"+word) {
			return true
		}
	}
	return false
}

// inParallel runs do(0..n-1), 32 at a time, and returns the first error.
func inParallel(n int, do func(i int) error) error {
	var group errgroup.Group
	group.SetLimit(32)
	for i := range n {
		group.Go(func() error { return do(i) })
	}
	return group.Wait()
}

// benchNodes makes n Nodes without kubelets, managed by the attach/detach controller, Ready
// when made, tainted against every pod but the bench's, each with a CSINode listing the
// driver (what kubelet's registration would have written). Deleted when the scenario ends.
func benchNodes(ctx context.Context, kube kubernetes.Interface, n int) []string {
	ginkgo.GinkgoHelper()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%03d", benchLabel, i)
	}
	ginkgo.DeferCleanup(func(ctx context.Context) {
		selector := metav1.ListOptions{LabelSelector: benchLabel}
		_ = kube.StorageV1().CSINodes().DeleteCollection(ctx, metav1.DeleteOptions{}, selector)
		_ = kube.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, selector)
	})
	err := inParallel(n, func(i int) error {
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name:        names[i],
				Labels:      map[string]string{benchLabel: "true"},
				Annotations: map[string]string{"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
			},
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: benchLabel, Value: "no-kubelet", Effect: corev1.TaintEffectNoSchedule}}},
		}
		made, err := kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("node %s: %w", names[i], err)
		}
		// Controllers (node lifecycle, taints) write the new node too: read it again on a conflict.
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			current, err := kube.CoreV1().Nodes().Get(ctx, names[i], metav1.GetOptions{})
			if err != nil {
				return err
			}
			current.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Bench", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
			current.Status.Capacity = corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1000")}
			_, err = kube.CoreV1().Nodes().UpdateStatus(ctx, current, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("node %s status: %w", names[i], err)
		}
		csiNode := &storagev1.CSINode{
			ObjectMeta: metav1.ObjectMeta{
				Name:            names[i],
				Labels:          map[string]string{benchLabel: "true"},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: made.Name, UID: made.UID}},
			},
			Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: benchCSIName, NodeID: names[i]}}},
		}
		if _, err := kube.StorageV1().CSINodes().Create(ctx, csiNode, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("CSINode %s: %w", names[i], err)
		}
		return nil
	})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "making the nodes without kubelets")
	return names
}

// attachedCount is how many volumes the bench nodes' status lists as attached.
func attachedCount(ctx context.Context, kube kubernetes.Interface) (int, error) {
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: benchLabel})
	if err != nil {
		return 0, err
	}
	attached := 0
	for _, node := range nodes.Items {
		attached += len(node.Status.VolumesAttached)
	}
	return attached, nil
}

// attachmentsDone is how many of the driver's VolumeAttachments say attached (want > 0), or how
// many are left (want 0).
func attachmentsDone(ctx context.Context, kube kubernetes.Interface, want int) (bool, error) {
	attachments, err := kube.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err
	}
	attached, left := 0, 0
	for _, attachment := range attachments.Items {
		if attachment.Spec.Attacher != benchCSIName {
			continue
		}
		left++
		if attachment.Status.Attached {
			attached++
		}
	}
	if want == 0 {
		return left == 0, nil
	}
	return attached == want, nil
}

// waitAttached polls the nodes' status until want volumes are attached; returns when it saw it,
// and when the CSI driver's VolumeAttachments first said the same (zero when there are none):
// what csi-attacher and flexd did, before kube-controller-manager noticed.
func waitAttached(ctx context.Context, kube kubernetes.Interface, want int, timeout time.Duration, what string) (seen, attachments time.Time) {
	ginkgo.GinkgoHelper()
	WaitFor(ctx, timeout, what, func(ctx context.Context) error {
		if attachments.IsZero() {
			if done, err := attachmentsDone(ctx, kube, want); err == nil && done {
				attachments = time.Now()
			}
		}
		attached, err := attachedCount(ctx, kube)
		if err != nil {
			return err
		}
		if attached != want {
			return fmt.Errorf("%d volumes attached, waiting for %d", attached, want)
		}
		seen = time.Now()
		return nil
	})
	return seen, attachments
}

// benchPod is a pod bound to the node (no scheduler, no kubelet: it stays Pending) with the
// claim, tolerating everything the nodes without kubelets get.
func benchPod(name, node, claim string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace, Labels: map[string]string{benchLabel: "true"}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			AutomountServiceAccountToken:  ptr.To(false),
			Containers:                    []corev1.Container{{Name: "main", Image: cluster.ToolsImage, Command: []string{"true"}, VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes:                       []corev1.Volume{{Name: "data", VolumeSource: ClaimVolume(claim)}},
		},
	}
}

// deleteBenchObjects deletes the bench's pods, claims and PVs, and waits until they are gone.
func deleteBenchObjects(ctx context.Context, kube kubernetes.Interface) {
	selector := metav1.ListOptions{LabelSelector: benchLabel}
	now := metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}
	_ = kube.CoreV1().Pods(podNamespace).DeleteCollection(ctx, now, selector)
	_ = kube.CoreV1().PersistentVolumeClaims(podNamespace).DeleteCollection(ctx, metav1.DeleteOptions{}, selector)
	_ = kube.CoreV1().PersistentVolumes().DeleteCollection(ctx, metav1.DeleteOptions{}, selector)
	WaitFor(ctx, 300*time.Second, "the bench's pods, claims and PVs to go", func(ctx context.Context) error {
		pods, err := kube.CoreV1().Pods(podNamespace).List(ctx, selector)
		if err != nil || len(pods.Items) > 0 {
			return fmt.Errorf("pods left: %v", err)
		}
		pvs, err := kube.CoreV1().PersistentVolumes().List(ctx, selector)
		if err != nil {
			return err
		}
		if len(pvs.Items) > 0 {
			return fmt.Errorf("%d PVs left", len(pvs.Items))
		}
		return nil
	})
}

func envInt(name string, fallback int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return fallback
}

// scenarioAttachScale: E2E_ATTACH_NODES nodes (50), E2E_ATTACH_VOLUMES volumes (200) across
// them, one pod each, attached and detached through each path; the times, side by side, and
// flexd's controller CPU and peak RSS.
func scenarioAttachScale(ctx context.Context) {
	c := cluster
	nodeCount, volumes := envInt("E2E_ATTACH_NODES", 50), envInt("E2E_ATTACH_VOLUMES", 200)
	summary := c.NewSummary("attach_scale")
	// The bench's own client must not be what limits it.
	config := rest.CopyConfig(c.Config)
	config.QPS, config.Burst = 500, 1000
	kube, err := kubernetes.NewForConfig(config)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())

	ginkgo.By("the bench driver installed as " + benchDriver + " on every node (node 0's plugin dir is kube-controller-manager's too)")
	c.MustFlexdEverywhere(ctx, "install", "--driver", benchDriver, filepath.Join(c.Here, "drivers", "attachbench"))
	ginkgo.DeferCleanup(func(ctx context.Context) {
		c.FlexdEverywhere(ctx, "uninstall", "--driver", benchDriver)
		err := c.Kube.StorageV1().CSIDrivers().Delete(ctx, benchCSIName, metav1.DeleteOptions{})
		if !apierrors.IsNotFound(err) {
			gomega.Expect(err).NotTo(gomega.HaveOccurred())
		}
	})
	ginkgo.By("flexd's manifests with a controller for it")
	c.ApplyManifests(ctx, "flexd-attach-bench", append([]string{"--driver", c.Driver, "--driver", benchDriver}, c.SidecarImageFlags...)...)
	c.WaitCSINodeLists(ctx, benchCSIName)

	ginkgo.By(fmt.Sprintf("%d nodes without kubelets", nodeCount))
	nodes := benchNodes(ctx, kube, nodeCount)
	ginkgo.DeferCleanup(deleteBenchObjects, kube)

	paths := []attachPath{
		{"kube-controller-manager FlexVolume", func(volume string) corev1.PersistentVolumeSource {
			return FlexSource(benchDriver, map[string]string{"volume": volume})
		}},
		{"flexd", func(volume string) corev1.PersistentVolumeSource {
			return CSISource(benchCSIName, volume, map[string]string{"volume": volume})
		}},
	}
	attachTimes, detachTimes := map[string]float64{}, map[string]float64{}
	for _, path := range paths {
		ginkgo.By(path.name + ": PVs and their claims, Bound")
		err := inParallel(volumes, func(i int) error {
			name := fmt.Sprintf("%s-%03d", benchLabel, i)
			pv := PersistentVolume(name, "1Gi", path.source(name))
			pv.Labels = map[string]string{benchLabel: "true"}
			pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: podNamespace, Name: name}
			if _, err := kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
				return err
			}
			claim := &corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace, Labels: map[string]string{benchLabel: "true"}},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName: ptr.To(""),
					VolumeName:       name,
					Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
				},
			}
			_, err := kube.CoreV1().PersistentVolumeClaims(podNamespace).Create(ctx, claim, metav1.CreateOptions{})
			return err
		})
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "making the PVs and claims")
		WaitFor(ctx, 300*time.Second, "every claim Bound", func(ctx context.Context) error {
			claims, err := kube.CoreV1().PersistentVolumeClaims(podNamespace).List(ctx, metav1.ListOptions{LabelSelector: benchLabel})
			if err != nil {
				return err
			}
			bound := 0
			for _, claim := range claims.Items {
				if claim.Status.Phase == corev1.ClaimBound {
					bound++
				}
			}
			if bound != volumes {
				return fmt.Errorf("%d of %d claims Bound", bound, volumes)
			}
			return nil
		})

		cpuBefore, _, _ := processUsage("serve", "--mode=controller")
		managerBefore, _, _ := processUsage("kube-controller-manager")
		ginkgo.By(fmt.Sprintf("%s: %d pods bound across %d nodes, until every volume is attached", path.name, volumes, nodeCount))
		start := time.Now()
		err = inParallel(volumes, func(i int) error {
			name := fmt.Sprintf("%s-%03d", benchLabel, i)
			_, err := kube.CoreV1().Pods(podNamespace).Create(ctx, benchPod(name, nodes[i%nodeCount], name), metav1.CreateOptions{})
			return err
		})
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "making the pods")
		attached, attachments := waitAttached(ctx, kube, volumes, 20*time.Minute, "every volume attached")
		attachTimes[path.name] = attached.Sub(start).Seconds()
		attachmentsAt := attachments.Sub(start).Seconds()

		ginkgo.By(path.name + ": the pods deleted, until no volume is attached")
		start = time.Now()
		err = kube.CoreV1().Pods(podNamespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}, metav1.ListOptions{LabelSelector: benchLabel})
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting the pods")
		detached, attachmentsGone := waitAttached(ctx, kube, 0, 20*time.Minute, "every volume detached")
		detachTimes[path.name] = detached.Sub(start).Seconds()
		cpuAfter, peak, replicas := processUsage("serve", "--mode=controller")
		managerAfter, _, _ := processUsage("kube-controller-manager")
		summary.Printf("%s: attached in %.1fs, detached in %.1fs; kube-controller-manager CPU %.2f ms per attach+detach",
			path.name, attachTimes[path.name], detachTimes[path.name], (managerAfter-managerBefore)*1000/float64(volumes))
		if path.name == "flexd" {
			gone := "some still there when the nodes' status listed none"
			if !attachmentsGone.IsZero() {
				gone = fmt.Sprintf("every one gone after %.1fs", attachmentsGone.Sub(start).Seconds())
			}
			summary.Printf("flexd: every VolumeAttachment attached after %.1fs; %s", attachmentsAt, gone)
			summary.Printf("flexd's controller (%d replicas): CPU %.2f ms per attach+detach, peak RSS %.1f MiB",
				replicas, (cpuAfter-cpuBefore)*1000/float64(volumes), float64(peak)/(1<<20))
		}
		deleteBenchObjects(ctx, kube)
	}
	flex, flexd := paths[0].name, paths[1].name
	summary.Printf("attach, %d volumes across %d nodes: %s %.1fs, flexd %.1fs %.2fx", volumes, nodeCount, flex, attachTimes[flex], attachTimes[flexd], attachTimes[flexd]/attachTimes[flex])
	summary.Printf("detach, %d volumes across %d nodes: %s %.1fs, flexd %.1fs %.2fx", volumes, nodeCount, flex, detachTimes[flex], detachTimes[flexd], detachTimes[flexd]/detachTimes[flex])
}
