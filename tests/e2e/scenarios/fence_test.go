package scenarios

// flexd's per-volume fence (issue #48) under chaos. Two controller replicas, whose csi-attachers
// elect their leader apart from flexd, attach and detach a slow driver's volumes
// (tests/e2e/drivers/fence) to and from the nodes through VolumeAttachments the scenario makes
// itself (no pods), round after round; in each round one fault hits the replica whose driver
// call is in flight: SIGKILL, csi-attacher's leader lease handed to the other replica (two
// leaders for a while), or its connection to the API server cut for longer than a fence's
// lease. The driver logs every call, so that the scenario proves that no two calls changing a
// volume ran at once, and, once each round settled, that the driver's claims, the
// VolumeAttachments and the FlexdRecords agree. Needs E2E_NODES >= 2 (3 in CI).

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

const (
	// The controller replicas' fence lease in this scenario (flexd manifests --fence-lease):
	// shorter than serve's 20 s default, so that a round's takeover costs less, and still
	// twice the call slack below.
	fenceLeaseSeconds = 10
	fenceDriver       = "e2e/fence"
	fenceCSIName      = "flexvolume-e2e--fence"
	// The static PVs the rounds move between nodes.
	fenceVolumeCount = 3
	// How long a round's VolumeAttachments get to settle: after a fault, csi-attacher's lease
	// (15 s) and a fence's (fenceLeaseSeconds) to be taken over, and csi-attacher's backoff of the calls
	// refused meanwhile (1 s doubling).
	fenceSettle = 420 * time.Second
	// How long a driver call may outlive the wait it logged (a loaded machine's forks and
	// writes): past that, a call that logged no end was over. A takeover of a fence comes a
	// lease (fenceLeaseSeconds) after its holder's last renewal, beyond.
	fenceCallSlack = 5.0
	// The nftables table that cuts a replica from the API server, in its network namespace.
	fenceCutTable = "flexd-e2e-fence"
)

// The faults, one a round (E2E_FENCE_FAULTS picks among them).
const (
	// The replica whose call is in flight SIGKILLed (every process of its pod) and its pod
	// deleted at once: it releases nothing.
	fenceKill = "kill"
	// csi-attacher's leader lease handed to the other replica while the holder's call runs.
	fenceLease = "lease"
	// The replica's packets to the API server dropped for longer than a fence's lease: 12-18 s.
	fenceCut = "cut"
)

// fenceOp is one change of a round: after a pause, the VolumeAttachment of a volume to a node
// created or deleted.
type fenceOp struct {
	create       bool
	volume, node string
	pause        time.Duration
}

func (op fenceOp) String() string {
	if op.create {
		return "+" + op.volume + "@" + op.node
	}
	return "-" + op.volume + "@" + op.node
}

// fenceRound is what a round does, all drawn from the seed before it starts.
type fenceRound struct {
	ops   []fenceOp
	fault string
	// From the round's first call in flight to the fault.
	delay time.Duration
	// How long a cut lasts.
	cut time.Duration
	// Once the round settled: the node each volume is attached to, "" for none.
	want map[string]string
}

// planFenceRound draws a round from the state each volume is in (its node, "" for none): an
// unattached volume is attached to a random node (3 in 4), an attached one moved to another
// node (1 in 2: its VolumeAttachment deleted and the new one created, in a random order, so the
// new node's attach may find the volume still claimed) or detached (1 in 4); at least one
// volume changes. The ops in a random order, a random pause before each.
func planFenceRound(rng *rand.Rand, volumes, nodes []string, state map[string]string, faults []string) fenceRound {
	round := fenceRound{want: maps.Clone(state)}
	change := func(volume string, roll int) {
		from := state[volume]
		switch {
		case from == "" && roll < 3:
			to := nodes[rng.IntN(len(nodes))]
			round.ops = append(round.ops, fenceOp{create: true, volume: volume, node: to})
			round.want[volume] = to
		case from != "" && roll < 2:
			others := slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return n == from })
			to := others[rng.IntN(len(others))]
			round.ops = append(round.ops, fenceOp{volume: volume, node: from}, fenceOp{create: true, volume: volume, node: to})
			round.want[volume] = to
		case from != "" && roll < 3:
			round.ops = append(round.ops, fenceOp{volume: volume, node: from})
			round.want[volume] = ""
		}
	}
	for _, volume := range volumes {
		change(volume, rng.IntN(4))
	}
	if len(round.ops) == 0 {
		change(volumes[rng.IntN(len(volumes))], 0)
	}
	rng.Shuffle(len(round.ops), func(i, j int) { round.ops[i], round.ops[j] = round.ops[j], round.ops[i] })
	for i := range round.ops {
		round.ops[i].pause = time.Duration(rng.IntN(1500)) * time.Millisecond
	}
	round.fault = faults[rng.IntN(len(faults))]
	round.delay = time.Duration(rng.IntN(1500)) * time.Millisecond
	round.cut = (fenceLeaseSeconds+2)*time.Second + time.Duration(rng.IntN(6000))*time.Millisecond
	return round
}

// scenarioFence: E2E_FENCE_ROUNDS rounds (20) drawn from a seed (printed; E2E_FENCE_SEED replays
// the same plan), each with one fault (E2E_FENCE_FAULTS, default "kill lease cut"). After each
// round, once every VolumeAttachment is attached or gone and both replicas run again: at most
// one node holds each volume; every claim of the driver has its FlexdRecord attachment (stage
// mounted) and its VolumeAttachment, every attached VolumeAttachment its claim; no fence is
// left; and, from the driver's log, no two calls changing a volume overlapped and no volume was
// attached to a second node before it was released. At the end everything is deleted: no claim,
// VolumeAttachment or FlexdRecord of the volumes is left.
func scenarioFence(ctx context.Context) {
	c := cluster
	c.needNodes("fence", 2)
	rounds := envInt("E2E_FENCE_ROUNDS", 20)
	seed := fenceSeed()
	faults := fenceFaults()
	rng := rand.New(rand.NewPCG(seed, 48))
	summary := c.NewSummary("fence")
	summary.Printf("fence: seed %d (E2E_FENCE_SEED=%d replays its plan), %d rounds, faults %v", seed, seed, rounds, faults)
	started := time.Now()

	// Under the scratch dir, which every node sees (the nodes' shared storage, as the loop
	// images beside it), but not in the loop driver's image dir, which stays the loop driver's.
	dir := c.Path("fence")
	ginkgo.By("the fence driver installed as " + fenceDriver + ", its claims and log in " + dir)
	driver := c.setUpFenceDir(dir)
	ginkgo.DeferCleanup(func(ctx context.Context) {
		// The log and claims, with the run's logs (kept when it fails).
		_ = os.WriteFile(c.Path("logs", "fence-calls.log"), []byte(readOrEmpty(filepath.Join(dir, "calls.log"))), 0o644)
		c.FlexdEverywhere(ctx, "uninstall", "--driver", fenceDriver)
		err := c.Kube.StorageV1().CSIDrivers().Delete(ctx, fenceCSIName, metav1.DeleteOptions{})
		if !apierrors.IsNotFound(err) {
			gomega.Expect(err).NotTo(gomega.HaveOccurred())
		}
	})
	c.MustFlexdEverywhere(ctx, "install", "--driver", fenceDriver, driver)

	ginkgo.By("flexd's manifests for the hostdir and fence drivers (" + dir + " a host dir of both pods): two controller replicas")
	c.ApplyManifests(ctx, "flexd-fence", append([]string{"--driver", c.Driver, "--driver", fenceDriver, "--host-dir", dir,
		"--fence-lease", fmt.Sprintf("%ds", fenceLeaseSeconds)}, c.SidecarImageFlags...)...)
	c.WaitCSINodeLists(ctx, fenceCSIName)
	c.waitControllerReady(ctx, 2, 300*time.Second)

	var volumes, nodes []string
	for i := 0; i < fenceVolumeCount; i++ {
		volumes = append(volumes, fmt.Sprintf("e2e-fence-%d", i))
	}
	for _, node := range c.Nodes {
		nodes = append(nodes, node.Name)
	}
	ginkgo.By(fmt.Sprintf("%d static PVs of the fence driver: %v", len(volumes), volumes))
	for _, volume := range volumes {
		_, err := c.Kube.CoreV1().PersistentVolumes().Create(ctx,
			PersistentVolume(volume, "1Gi", CSISource(fenceCSIName, volume, map[string]string{"fenceVolume": volume})), metav1.CreateOptions{})
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "creating PV %s", volume)
		ginkgo.DeferCleanup(c.DeletePVIfThere, volume)
	}
	// Before the PVs go: every VolumeAttachment, detached.
	ginkgo.DeferCleanup(c.deleteFenceAttachments)

	state := map[string]string{}
	dead := map[string]float64{} // killed replica → when (uptime) no process of it was left
	counts := map[string]int{}
	logPath := filepath.Join(dir, "calls.log")
	for round := 1; round <= rounds; round++ {
		plan := planFenceRound(rng, volumes, nodes, state, faults)
		ginkgo.By(fmt.Sprintf("round %d of %d: %v, fault %s", round, rounds, plan.ops, plan.fault))
		since := uptime()
		roundStart := time.Now()
		done := make(chan error, 1)
		go func() {
			defer ginkgo.GinkgoRecover()
			done <- c.applyFenceOps(ctx, plan.ops)
		}()

		// The fault, plan.delay after the round's first call changing a volume began, at the
		// replica making it (csi-attacher's leader, whose flexd the call runs in).
		call := c.waitFenceCall(ctx, logPath, since, 30*time.Second)
		target, hit := "", "no call in flight within 30s"
		if call != nil {
			sleepCtx(ctx, plan.delay)
			target = call.caller
			hit = fmt.Sprintf("%s of %s to %s in flight (begun %.1fs before)", call.call, call.volume, call.node, uptime()-call.begin)
		}
		pod, ok := c.controllerPod(ctx, target)
		if !ok {
			pod, _ = c.controllerPod(ctx, c.leaseHolder(ctx, "csi-attacher's leader lease for "+fenceCSIName, fenceAttacherLease))
		}
		var what string
		switch plan.fault {
		case fenceKill:
			dead[pod.Name] = c.fenceKill(ctx, pod)
			what = "SIGKILLed " + pod.Name + " and deleted its pod"
		case fenceLease:
			from, to := c.handAttacherLeaseOver(ctx)
			what = fmt.Sprintf("handed csi-attacher's lease from %s to %s", from, to)
		case fenceCut:
			c.cutFromAPIServer(ctx, pod, plan.cut)
			what = fmt.Sprintf("cut %s from the API server for %.0fs", pod.Name, plan.cut.Seconds())
		}
		counts[plan.fault]++
		gomega.Expect(<-done).To(gomega.Succeed(), "round %d's VolumeAttachments", round)

		WaitFor(ctx, fenceSettle, fmt.Sprintf("round %d's VolumeAttachments to settle (attached, or gone)", round), c.fenceSettled(volumes, plan.want))
		settled := time.Since(roundStart)
		c.waitControllerReady(ctx, 2, 300*time.Second)
		state = plan.want
		summary.Printf("round %d: %v; %s, %s; settled after %.0fs", round, plan.ops, what, hit, settled.Seconds())
		c.expectFenceInvariants(ctx, fmt.Sprintf("round %d (seed %d)", round, seed), dir, volumes, state, dead)
	}

	ginkgo.By("every VolumeAttachment deleted: no claim, VolumeAttachment or FlexdRecord of the volumes left")
	final := map[string]string{}
	for _, volume := range volumes {
		final[volume] = ""
		if node := state[volume]; node != "" {
			err := c.Kube.StorageV1().VolumeAttachments().Delete(ctx, fenceAttachmentName(volume, node), metav1.DeleteOptions{})
			gomega.Expect(err).NotTo(gomega.HaveOccurred(), "deleting the VolumeAttachment of %s to %s", volume, node)
		}
	}
	WaitFor(ctx, fenceSettle, "every VolumeAttachment of the fence driver to go", c.fenceSettled(volumes, final))
	WaitFor(ctx, 60*time.Second, "no FlexdRecord of the volumes left", func(ctx context.Context) error {
		for _, volume := range volumes {
			if records, err := c.flexdRecordsOf(ctx, volume); err != nil || len(records) > 0 {
				return fmt.Errorf("%s: %d FlexdRecords (%v)", volume, len(records), err)
			}
		}
		return nil
	})
	c.expectFenceInvariants(ctx, fmt.Sprintf("the end (seed %d)", seed), dir, volumes, final, dead)
	calls := readFenceLog(logPath)
	by := map[string]int{}
	outcomes := map[string]int{}
	for _, call := range calls.changing {
		by[call.caller]++
		outcomes[call.outcome]++
	}
	summary.Printf("fence: %d rounds in %s (faults: %d kill, %d lease, %d cut); %d driver calls changing a volume (by replica: %v), %d succeeded, %d refused, %d killed by flexd (SIGTERM), %d ended by a replica's SIGKILL; none overlapped",
		rounds, time.Since(started).Round(time.Second), counts[fenceKill], counts[fenceLease], counts[fenceCut],
		len(calls.changing), by, outcomes["ok"], outcomes["fail"], outcomes["term"], outcomes[""])
}

// fenceSeed is E2E_FENCE_SEED, or a new one.
func fenceSeed() uint64 {
	ginkgo.GinkgoHelper()
	if text := os.Getenv("E2E_FENCE_SEED"); text != "" {
		seed, err := strconv.ParseUint(text, 10, 64)
		gomega.Expect(err).NotTo(gomega.HaveOccurred(), "E2E_FENCE_SEED=%s: a number", text)
		return seed
	}
	return uint64(time.Now().UnixNano())
}

// fenceFaults are E2E_FENCE_FAULTS' words (kill, lease, cut), every fault by default.
func fenceFaults() []string {
	ginkgo.GinkgoHelper()
	all := []string{fenceKill, fenceLease, fenceCut}
	words := strings.Fields(os.Getenv("E2E_FENCE_FAULTS"))
	if len(words) == 0 {
		return all
	}
	for _, word := range words {
		gomega.Expect(all).To(gomega.ContainElement(word), "E2E_FENCE_FAULTS=%q: words of %v", os.Getenv("E2E_FENCE_FAULTS"), all)
	}
	return words
}

// setUpFenceDir makes the driver's shared dir (its claims/, emptied, its log, truncated, and a
// static busybox for its commands) and the driver for it (run/fence), whose path it returns. The
// dirs are kept, not made anew: pods of an earlier run may still have them mounted.
func (c *Cluster) setUpFenceDir(dir string) string {
	ginkgo.GinkgoHelper()
	claims := filepath.Join(dir, "claims")
	gomega.Expect(os.MkdirAll(claims, 0o755)).To(gomega.Succeed())
	left, err := os.ReadDir(claims)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	for _, entry := range left {
		gomega.Expect(os.Remove(filepath.Join(claims, entry.Name()))).To(gomega.Succeed())
	}
	gomega.Expect(os.WriteFile(filepath.Join(dir, "calls.log"), nil, 0o644)).To(gomega.Succeed())
	busybox, err := exec.LookPath("busybox")
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "busybox (apt-get install busybox-static)")
	binary, err := elf.Open(busybox)
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "busybox at %s", busybox)
	for _, prog := range binary.Progs {
		gomega.Expect(prog.Type).NotTo(gomega.Equal(elf.PT_INTERP), "%s is linked dynamically: flexd's image has not its libraries (apt-get install busybox-static)", busybox)
	}
	_ = binary.Close()
	data, err := os.ReadFile(busybox)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	// Renamed into place: an earlier run's copy may still be running.
	gomega.Expect(os.WriteFile(filepath.Join(dir, ".busybox"), data, 0o755)).To(gomega.Succeed())
	gomega.Expect(os.Rename(filepath.Join(dir, ".busybox"), filepath.Join(dir, "busybox"))).To(gomega.Succeed())
	source := ReadFile(filepath.Join(c.Here, "drivers", "fence"))
	lines := strings.Split(source, "\n")
	at := slices.IndexFunc(lines, func(line string) bool { return strings.HasPrefix(line, "DIR=") })
	gomega.Expect(at).NotTo(gomega.Equal(-1), "the DIR= line of tests/e2e/drivers/fence")
	lines[at] = "DIR=" + dir
	path := c.WriteRun("fence", strings.Join(lines, "\n"))
	gomega.Expect(os.Chmod(path, 0o755)).To(gomega.Succeed())
	return path
}

// readOrEmpty is the file's content, "" when it cannot be read.
func readOrEmpty(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}

// fenceAttachmentName is the name of the scenario's VolumeAttachment of the volume to the node.
func fenceAttachmentName(volume, node string) string {
	return strings.ToLower(volume + "-" + node)
}

// applyFenceOps creates and deletes the round's VolumeAttachments (in its own goroutine: no
// assertion, an error).
func (c *Cluster) applyFenceOps(ctx context.Context, ops []fenceOp) error {
	for _, op := range ops {
		sleepCtx(ctx, op.pause)
		name := fenceAttachmentName(op.volume, op.node)
		if !op.create {
			if err := c.Kube.StorageV1().VolumeAttachments().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				return fmt.Errorf("deleting VolumeAttachment %s: %w", name, err)
			}
			continue
		}
		_, err := c.Kube.StorageV1().VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: storagev1.VolumeAttachmentSpec{
				Attacher: fenceCSIName,
				Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To(op.volume)},
				NodeName: op.node,
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating VolumeAttachment %s: %w", name, err)
		}
	}
	return nil
}

// sleepCtx sleeps for d, or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// uptime is /proc/uptime's seconds: the clock of the driver's log (the host's and every pod's).
func uptime() float64 {
	ginkgo.GinkgoHelper()
	seconds, err := strconv.ParseFloat(strings.Fields(ReadFile("/proc/uptime"))[0], 64)
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "/proc/uptime")
	return seconds
}

// fenceSettled fails until each volume has a VolumeAttachment, attached, to the node want says
// and no other (the deleted ones gone: detached, csi-attacher's finalizer removed).
func (c *Cluster) fenceSettled(volumes []string, want map[string]string) func(context.Context) error {
	return func(ctx context.Context) error {
		attachments, err := c.Kube.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var waiting []string
		seen := map[string]bool{}
		for _, va := range attachments.Items {
			pv := va.Spec.Source.PersistentVolumeName
			if va.Spec.Attacher != fenceCSIName || pv == nil || !slices.Contains(volumes, *pv) {
				continue
			}
			if want[*pv] == va.Spec.NodeName && va.DeletionTimestamp == nil {
				seen[*pv] = true
				if !va.Status.Attached {
					waiting = append(waiting, fmt.Sprintf("%s not attached yet%s", va.Name, volumeError(va.Status.AttachError)))
				}
				continue
			}
			waiting = append(waiting, fmt.Sprintf("%s still there (attached: %v)%s", va.Name, va.Status.Attached, volumeError(va.Status.DetachError)))
		}
		for _, volume := range volumes {
			if node := want[volume]; node != "" && !seen[volume] {
				waiting = append(waiting, fmt.Sprintf("no VolumeAttachment of %s to %s", volume, node))
			}
		}
		if len(waiting) > 0 {
			return errors.New(strings.Join(waiting, "; "))
		}
		return nil
	}
}

func volumeError(e *storagev1.VolumeError) string {
	if e == nil {
		return ""
	}
	return fmt.Sprintf(" (%s: %s)", e.Time.Format(time.TimeOnly), e.Message)
}

// deleteFenceAttachments deletes every VolumeAttachment of the fence driver and waits for
// them to go; those still there after that lose their finalizers (a cleanup: it leaves nothing
// behind for the next scenario whatever happened).
func (c *Cluster) deleteFenceAttachments(ctx context.Context) {
	list := func() []storagev1.VolumeAttachment {
		attachments, err := c.Kube.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil
		}
		return slices.DeleteFunc(attachments.Items, func(va storagev1.VolumeAttachment) bool { return va.Spec.Attacher != fenceCSIName })
	}
	for _, va := range list() {
		_ = c.Kube.StorageV1().VolumeAttachments().Delete(ctx, va.Name, metav1.DeleteOptions{})
	}
	for deadline := time.Now().Add(fenceSettle); time.Now().Before(deadline) && len(list()) > 0; {
		sleepCtx(ctx, poll)
	}
	for _, va := range list() {
		fmt.Fprintf(ginkgo.GinkgoWriter, "VolumeAttachment %s still there: its finalizers removed\n", va.Name)
		va.Finalizers = nil
		_, _ = c.Kube.StorageV1().VolumeAttachments().Update(ctx, &va, metav1.UpdateOptions{})
	}
}

// waitControllerReady waits until the controller has n replicas, each Running with every
// container ready (a csi-attacher that stopped leading exits, and is restarted), and no other
// pod.
func (c *Cluster) waitControllerReady(ctx context.Context, n int, timeout time.Duration) {
	ginkgo.GinkgoHelper()
	WaitFor(ctx, timeout, fmt.Sprintf("%d controller replicas Running and ready", n), func(ctx context.Context) error {
		pods, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=flexd-controller"})
		if err != nil {
			return err
		}
		ready := 0
		var states []string
		for _, pod := range pods.Items {
			ok := pod.Status.Phase == corev1.PodRunning && pod.DeletionTimestamp == nil
			var notReady []string
			for _, status := range pod.Status.ContainerStatuses {
				if !status.Ready {
					ok = false
					notReady = append(notReady, status.Name)
				}
			}
			if ok && len(pod.Status.ContainerStatuses) > 0 {
				ready++
			}
			states = append(states, fmt.Sprintf("%s %s (not ready: %v)", pod.Name, pod.Status.Phase, notReady))
		}
		if ready != n || len(pods.Items) != n {
			return fmt.Errorf("%d ready of %d pods: %v", ready, len(pods.Items), states)
		}
		return nil
	})
}

// controllerPod is the Running controller replica of that name.
func (c *Cluster) controllerPod(ctx context.Context, name string) (corev1.Pod, bool) {
	ginkgo.GinkgoHelper()
	for _, pod := range c.ControllerPods(ctx) {
		if pod.Name == name {
			return pod, true
		}
	}
	return corev1.Pod{}, false
}

// fenceAttacherLease picks csi-attacher's leader lease of the fence driver.
func fenceAttacherLease(lease string) bool {
	return strings.Contains(lease, "attacher") && strings.HasSuffix(lease, fenceCSIName)
}

// podPids are the processes in the pod's cgroup, as podProcess finds them: its containers'
// (with their children: flexd's driver calls) and its pause.
func podPids(podUID string) []int {
	ginkgo.GinkgoHelper()
	entries, err := os.ReadDir("/proc")
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	inPod := []string{"pod" + podUID, "pod" + strings.ReplaceAll(podUID, "-", "_")}
	var pids []int
	for _, entry := range entries {
		pid, err := strconv.Atoi(entry.Name())
		if err != nil {
			continue
		}
		cgroup, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err == nil && (strings.Contains(string(cgroup), inPod[0]) || strings.Contains(string(cgroup), inPod[1])) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// fenceKill SIGKILLs every process of the controller replica (flexd, its driver calls, the
// sidecars, the pod's pause: it releases nothing, as when its node is lost) and deletes its pod
// at once (no grace, as killReplica); it returns when (uptime) no process of it was left.
func (c *Cluster) fenceKill(ctx context.Context, pod corev1.Pod) float64 {
	ginkgo.GinkgoHelper()
	uid := string(pod.UID)
	for _, pid := range podPids(uid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	c.killReplica(ctx, pod.Name)
	for deadline := time.Now().Add(120 * time.Second); time.Now().Before(deadline); {
		left := podPids(uid)
		if len(left) == 0 {
			return uptime()
		}
		// What kubelet restarted meanwhile, too.
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
	ginkgo.Fail(fmt.Sprintf("processes of the killed replica %s still there: %v", pod.Name, podPids(uid)))
	return 0
}

// handAttacherLeaseOver hands csi-attacher's leader lease of the fence driver from its holder to
// the other replica, renewed now, as if the holder had not renewed it: the other replica's
// csi-attacher leads from its next try (every 5 s) while the holder's goes on until its renew
// deadline (10 s) makes it stop leading (it exits, and is restarted): for that while both call
// their flexd. It returns the holder and the new one.
func (c *Cluster) handAttacherLeaseOver(ctx context.Context) (from, to string) {
	ginkgo.GinkgoHelper()
	from = c.leaseHolder(ctx, "csi-attacher's leader lease for "+fenceCSIName, fenceAttacherLease)
	for _, pod := range c.ControllerPods(ctx) {
		if pod.Name != from {
			to = pod.Name
		}
	}
	gomega.Expect(to).NotTo(gomega.BeEmpty(), "a Running controller replica besides %s", from)
	leases, err := c.Kube.CoordinationV1().Leases(c.Namespace).List(ctx, metav1.ListOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	name := ""
	for _, lease := range leases.Items {
		if fenceAttacherLease(lease.Name) {
			name = lease.Name
		}
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		lease, err := c.Kube.CoordinationV1().Leases(c.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.NewMicroTime(time.Now())
		transitions := int32(1)
		if lease.Spec.LeaseTransitions != nil {
			transitions = *lease.Spec.LeaseTransitions + 1
		}
		lease.Spec.HolderIdentity = ptr.To(to)
		lease.Spec.AcquireTime = &now
		lease.Spec.RenewTime = &now
		lease.Spec.LeaseTransitions = &transitions
		_, err = c.Kube.CoordinationV1().Leases(c.Namespace).Update(ctx, lease, metav1.UpdateOptions{})
		return err
	})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "handing the lease %s from %s to %s", name, from, to)
	return from, to
}

// cutFromAPIServer drops, in the replica's network namespace (its pause's), every packet it
// sends to the API server (the kubernetes Service's port 443, and 6443 behind it) for the while,
// then lets them through again: its csi-attacher loses its lease (and exits), its flexd cannot
// renew its fences (it must kill its driver calls before their leases end), the other replica
// takes over.
func (c *Cluster) cutFromAPIServer(ctx context.Context, pod corev1.Pod, d time.Duration) {
	ginkgo.GinkgoHelper()
	pid := podProcess(string(pod.UID), "pause")
	if pid == 0 {
		pid = podProcess(string(pod.UID), "flexd", "--mode=controller")
	}
	gomega.Expect(pid).NotTo(gomega.BeZero(), "a process of the controller replica %s", pod.Name)
	netns := fmt.Sprintf("--net=/proc/%d/ns/net", pid)
	restored := false
	restore := func(ctx context.Context) {
		if !restored {
			restored = true
			_, _ = Run(ctx, "nsenter", netns, "nft", "delete", "table", "inet", fenceCutTable)
		}
	}
	ginkgo.DeferCleanup(restore)
	MustRun(ctx, "nsenter", netns, "nft", "add", "table", "inet", fenceCutTable)
	MustRun(ctx, "nsenter", netns, "nft", "add", "chain", "inet", fenceCutTable, "output", "{ type filter hook output priority 0; policy accept; }")
	MustRun(ctx, "nsenter", netns, "nft", "add", "rule", "inet", fenceCutTable, "output", "tcp", "dport", "{ 443, 6443 }", "drop")
	sleepCtx(ctx, d)
	restore(ctx)
}

// fenceCall is one call of the driver's log that changes a volume (attach, detach).
type fenceCall struct {
	caller, id, call, volume, node string
	// In uptime seconds; end 0 while (or if never) it logged one.
	begin, end float64
	// The wait it logged it would take.
	wait float64
	// ok, fail, term (SIGTERM: flexd killed it), "" (no end logged: its replica SIGKILLed).
	outcome, detail string
}

// fenceLog is the driver's log: the calls that change a volume, in the order they began, and
// their ends in the order they were logged.
type fenceLog struct {
	changing []*fenceCall
	ends     []*fenceCall
	unparsed []string
}

// readFenceLog parses the driver's log (see tests/e2e/drivers/fence); a last line still being
// written is left for the next read.
func readFenceLog(path string) fenceLog {
	var log fenceLog
	text := readOrEmpty(path)
	if at := strings.LastIndexByte(text, '\n'); at >= 0 {
		text = text[:at]
	} else {
		return log
	}
	open := map[string]*fenceCall{}
	for _, line := range strings.Split(text, "\n") {
		fields := strings.SplitN(line, " ", 8)
		if len(fields) < 7 {
			log.unparsed = append(log.unparsed, line)
			continue
		}
		at, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			log.unparsed = append(log.unparsed, line)
			continue
		}
		detail := ""
		if len(fields) == 8 {
			detail = fields[7]
		}
		caller, id, call, phase := fields[1], fields[2], fields[3], fields[4]
		if call != "attach" && call != "detach" {
			continue
		}
		key := caller + " " + id
		switch phase {
		case "begin":
			c := &fenceCall{caller: caller, id: id, call: call, volume: fields[5], node: fields[6], begin: at}
			if ms, ok := strings.CutPrefix(detail, "wait="); ok {
				if n, err := strconv.Atoi(strings.TrimSuffix(ms, "ms")); err == nil {
					c.wait = float64(n) / 1000
				}
			}
			open[key] = c
			log.changing = append(log.changing, c)
		case "ok", "fail", "term":
			c := open[key]
			if c == nil {
				log.unparsed = append(log.unparsed, line)
				continue
			}
			delete(open, key)
			c.end, c.outcome, c.detail = at, phase, detail
			log.ends = append(log.ends, c)
		default:
			log.unparsed = append(log.unparsed, line)
		}
	}
	return log
}

// String is the call as a person reads it.
func (c *fenceCall) String() string {
	end := "no end logged"
	if c.end > 0 {
		end = fmt.Sprintf("%s at %.2f: %s", c.outcome, c.end, c.detail)
	}
	return fmt.Sprintf("%s %s %s by %s (id %s) from %.2f, %s", c.call, c.volume, c.node, c.caller, c.id, c.begin, end)
}

// latestEnd is when the call was over at the latest: its end, or, when it logged none (its
// replica SIGKILLed, or a kill that left no time for its trap), its wait and fenceCallSlack past
// its begin, or earlier when its replica was dead by then.
func (c *fenceCall) latestEnd(dead map[string]float64) float64 {
	if c.end > 0 {
		return c.end
	}
	latest := c.begin + c.wait + fenceCallSlack
	if at, ok := dead[c.caller]; ok && at >= c.begin && at < latest {
		latest = at
	}
	return latest
}

// overlaps are the pairs of calls changing the same volume that ran at once: what the fence
// forbids (whichever replicas made them).
func (log fenceLog) overlaps(dead map[string]float64) []string {
	var found []string
	for i, a := range log.changing {
		for _, b := range log.changing[i+1:] {
			if a.volume == b.volume && b.begin < a.latestEnd(dead) && a.begin < b.latestEnd(dead) {
				found = append(found, fmt.Sprintf("%v\n    overlaps %v", a, b))
			}
		}
	}
	return found
}

// holders replays the calls' ends in the order they were logged: an attach that succeeded
// while another node held the volume (by the last successful attach not released since) is a
// volume held by two nodes. A call whose outcome is unknown (killed, or no end logged, from its
// begin on) leaves the holder unknown until the next success. It returns those, and the
// holder of each volume where it is known ("" none).
func (log fenceLog) holders() (twice []string, known map[string]string) {
	type event struct {
		call  *fenceCall
		begin bool
	}
	// The ends in order, each call that logged no end at its begin (from there on, unknown).
	var events []event
	ended := map[*fenceCall]bool{}
	for _, c := range log.ends {
		ended[c] = true
	}
	beginsLeft := slices.DeleteFunc(slices.Clone(log.changing), func(c *fenceCall) bool { return ended[c] })
	sort.SliceStable(beginsLeft, func(i, j int) bool { return beginsLeft[i].begin < beginsLeft[j].begin })
	ends := log.ends
	for len(ends) > 0 || len(beginsLeft) > 0 {
		if len(beginsLeft) > 0 && (len(ends) == 0 || beginsLeft[0].begin <= ends[0].end) {
			events = append(events, event{beginsLeft[0], true})
			beginsLeft = beginsLeft[1:]
		} else {
			events = append(events, event{ends[0], false})
			ends = ends[1:]
		}
	}
	const unknown = "?"
	holder := map[string]string{}
	for _, e := range events {
		c := e.call
		switch {
		case e.begin || c.outcome == "term":
			holder[c.volume] = unknown
		case c.call == "attach" && c.outcome == "ok":
			if h := holder[c.volume]; h != "" && h != unknown && h != c.node {
				twice = append(twice, fmt.Sprintf("%s attached to %s while %s held it: %v", c.volume, c.node, h, c))
			}
			holder[c.volume] = c.node
		case c.call == "detach" && c.outcome == "ok" && c.detail == "released":
			holder[c.volume] = ""
		}
	}
	known = map[string]string{}
	for volume, h := range holder {
		if h != unknown {
			known[volume] = h
		}
	}
	return twice, known
}

// fenceClaims are the driver's claims: volume → node.
func fenceClaims(dir string) map[string]string {
	ginkgo.GinkgoHelper()
	claims := map[string]string{}
	entries, err := os.ReadDir(filepath.Join(dir, "claims"))
	if errors.Is(err, fs.ErrNotExist) {
		return claims
	}
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	for _, entry := range entries {
		if strings.HasPrefix(entry.Name(), ".") {
			continue // a claim being written
		}
		claims[entry.Name()] = strings.TrimSpace(ReadFile(filepath.Join(dir, "claims", entry.Name())))
	}
	return claims
}

// waitFenceCall waits for the first call changing a volume that began (uptime) since, and
// returns it; nil when none began within the timeout.
func (c *Cluster) waitFenceCall(ctx context.Context, path string, since float64, timeout time.Duration) *fenceCall {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline) && ctx.Err() == nil; {
		for _, call := range readFenceLog(path).changing {
			if call.begin >= since {
				return call
			}
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
	return nil
}

// expectFenceInvariants, once the VolumeAttachments settled to want: the driver's claims, the
// VolumeAttachments and the FlexdRecords agree (and are want), no fence is left, and the
// driver's log has no overlapping calls and no volume held by two nodes.
func (c *Cluster) expectFenceInvariants(ctx context.Context, when, dir string, volumes []string, want map[string]string, dead map[string]float64) {
	ginkgo.GinkgoHelper()
	var broken []string
	claims := fenceClaims(dir)
	attached := map[string][]string{} // volume → nodes its attached VolumeAttachments are for
	has := map[string]bool{}          // "volume node" of every VolumeAttachment
	attachments, err := c.Kube.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	for _, va := range attachments.Items {
		pv := va.Spec.Source.PersistentVolumeName
		if va.Spec.Attacher != fenceCSIName || pv == nil {
			continue
		}
		has[*pv+" "+va.Spec.NodeName] = true
		if va.Status.Attached {
			attached[*pv] = append(attached[*pv], va.Spec.NodeName)
			// Every attached VolumeAttachment has its claim.
			if claims[*pv] != va.Spec.NodeName {
				broken = append(broken, fmt.Sprintf("VolumeAttachment %s says %s is attached to %s, the driver's claim says %q", va.Name, *pv, va.Spec.NodeName, claims[*pv]))
			}
		}
	}
	records := map[string]map[string]any{} // volume → spec of its one FlexdRecord
	for _, volume := range volumes {
		// At most one node holds each volume.
		if nodes := attached[volume]; len(nodes) > 1 {
			broken = append(broken, fmt.Sprintf("%s is attached to %d nodes: %v", volume, len(nodes), nodes))
		}
		if claims[volume] != want[volume] {
			broken = append(broken, fmt.Sprintf("the driver's claim of %s is %q, the scenario attached it to %q", volume, claims[volume], want[volume]))
		}
		found, err := c.flexdRecordsOf(ctx, volume)
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		switch {
		case len(found) > 1:
			broken = append(broken, fmt.Sprintf("%d FlexdRecords of %s", len(found), volume))
		case len(found) == 1:
			spec, _, _ := unstructured.NestedMap(found[0].Object, "spec")
			records[volume] = spec
			if fence, ok := spec["fence"]; ok && fence != nil {
				broken = append(broken, fmt.Sprintf("FlexdRecord %s of %s still holds a fence once every call was answered: %v", found[0].GetName(), volume, fence))
			}
			if want[volume] == "" {
				broken = append(broken, fmt.Sprintf("FlexdRecord %s of %s is left with nothing attached: %v", found[0].GetName(), volume, spec))
			}
		}
		attachmentsOf, _ := records[volume]["attachments"].(map[string]any)
		nodes := slices.Sorted(maps.Keys(attachmentsOf))
		if wanted := want[volume]; !slices.Equal(nodes, slices.DeleteFunc([]string{wanted}, func(n string) bool { return n == "" })) {
			broken = append(broken, fmt.Sprintf("the FlexdRecord of %s has attachments on %v, the scenario attached it to %q", volume, nodes, wanted))
		}
	}
	for volume, node := range claims {
		// Every claim has its FlexdRecord attachment (stage mounted) and its VolumeAttachment.
		attachmentsOf, _ := records[volume]["attachments"].(map[string]any)
		entry, _ := attachmentsOf[node].(map[string]any)
		if entry == nil {
			broken = append(broken, fmt.Sprintf("the driver's claim of %s is %s's, its FlexdRecord has no attachment on %s", volume, node, node))
		} else if stage := entry["stage"]; stage != "mounted" {
			broken = append(broken, fmt.Sprintf("the FlexdRecord attachment of %s on %s is at stage %v, not mounted", volume, node, stage))
		}
		if !has[volume+" "+node] {
			broken = append(broken, fmt.Sprintf("the driver's claim of %s is %s's, and there is no VolumeAttachment of %s to %s", volume, node, volume, node))
		}
	}
	log := readFenceLog(filepath.Join(dir, "calls.log"))
	for _, overlap := range log.overlaps(dead) {
		broken = append(broken, "two calls changing a volume at once: "+overlap)
	}
	twice, known := log.holders()
	broken = append(broken, twice...)
	for volume, node := range known {
		if claims[volume] != node {
			broken = append(broken, fmt.Sprintf("the driver's log says %s is held by %q, its claim says %q", volume, node, claims[volume]))
		}
	}
	if len(log.unparsed) > 0 {
		broken = append(broken, fmt.Sprintf("lines of the driver's log not understood: %q", log.unparsed))
	}
	gomega.Expect(broken).To(gomega.BeEmpty(), "after %s (the driver's log: %s; copied to logs/fence-calls.log when the scenario ends)", when, filepath.Join(dir, "calls.log"))
}
