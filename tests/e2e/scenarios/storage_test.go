package scenarios

// Kubernetes' own storage e2e suite for external CSI drivers (from the same Kubernetes version
// as the cluster, built by cluster.sh as bin/storage-e2e.test) against the two shapes of driver
// flexd serves.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The suite's specs that are not run, by choice, with the reason (docs/testing.md#the-storage-scenario):
//   - [Disruptive] specs restart kubelet or the node over SSH, which this cluster has no use for
//     (the faults_* scenarios restart them for real);
//   - "any volume data source" runs Kubernetes' volume populator example (hello-populator) and
//     the volume-data-source-validator, whose modules the Go module proxy does not serve: no
//     image of them can be built here. It tests those controllers, not the driver.
const storageSkip = `\[Disruptive\]|should provision storage with any volume data source`

// flexdDriver is a driver's entry in `flexd drivers --output json`: what flexd read at the
// driver's init. A capability the driver did not state is nil (FlexVolume's default applies).
type flexdDriver struct {
	Name         string `json:"name"`
	CSIName      string `json:"csiName"`
	Capabilities struct {
		Attach           *bool `json:"attach"`
		FSGroup          *bool `json:"fsGroup"`
		RequiresFSResize *bool `json:"requiresFSResize"`
		Provision        *bool `json:"provision"`
	} `json:"capabilities"`
}

func isTrue(b *bool) bool   { return b != nil && *b }
func notFalse(b *bool) bool { return b == nil || *b }

// storageDefinition is Kubernetes' test-driver definition (test/e2e/storage/external), as the
// suite's -storage.testdriver reads it.
type storageDefinition struct {
	StorageClass  struct{ FromName bool }
	InlineVolumes []inlineVolume
	DriverInfo    struct {
		Name               string
		SupportedSizeRange struct{ Min, Max string }
		SupportedFsType    map[string]struct{}
		MaxFileSize        int64
		Capabilities       map[string]bool
	}
}

type inlineVolume struct {
	Attributes map[string]string
	Shared     bool
}

// flexdDriverInfo is the driver's entry in `flexd drivers --output json`.
func (c *Cluster) flexdDriverInfo(ctx context.Context, driver string) flexdDriver {
	ginkgo.GinkgoHelper()
	out := c.MustFlexd(ctx, "--output", "json", "drivers")
	var drivers []flexdDriver
	gomega.Expect(json.Unmarshal([]byte(out), &drivers)).To(gomega.Succeed(), "`flexd drivers --output json`:\n%s", out)
	i := slices.IndexFunc(drivers, func(d flexdDriver) bool { return d.Name == driver })
	gomega.Expect(i).NotTo(gomega.Equal(-1), "%s in `flexd drivers --output json`:\n%s", driver, out)
	return drivers[i]
}

// StorageDefinition is the test-driver definition of a driver flexd serves, derived from what
// flexd read at the driver's init (`flexd drivers`) and the CSIDriver its manifests made, so
// that a driver is tested for what it declares; inline (nil: none) are the attributes of its
// CSI inline volume, offered when the CSIDriver has the Ephemeral mode. Capabilities flexd does
// not offer at all (block volumes, snapshots, cloning, topology, ReadWriteMany, capacity) are
// declared absent: the suite skips them.
func (c *Cluster) StorageDefinition(ctx context.Context, driver string, inline map[string]string) storageDefinition {
	ginkgo.GinkgoHelper()
	info := c.flexdDriverInfo(ctx, driver)
	csidriver, err := c.Kube.StorageV1().CSIDrivers().Get(ctx, info.CSIName, metav1.GetOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred(), "the CSIDriver %s", info.CSIName)
	caps := info.Capabilities
	// FlexVolume defaults: attach unless the driver says false; the rest only when true.
	controller := notFalse(caps.Attach) || isTrue(caps.Provision)
	expands := isTrue(caps.RequiresFSResize) && controller

	// A volume of one node only, unless there are several nodes and the driver attaches: the
	// loop driver's images are in the nodes' shared dir (cluster.sh), so its volumes move
	// between nodes; the hostdir driver's are inline and stay on theirs.
	singleNode := len(c.Nodes) == 1 || !controller

	var d storageDefinition
	d.StorageClass.FromName = isTrue(caps.Provision)
	d.InlineVolumes = []inlineVolume{}
	if slices.Contains(csidriver.Spec.VolumeLifecycleModes, storagev1.VolumeLifecycleEphemeral) && inline != nil {
		d.InlineVolumes = append(d.InlineVolumes, inlineVolume{Attributes: inline, Shared: true})
	}
	d.DriverInfo.Name = info.CSIName
	d.DriverInfo.SupportedSizeRange.Min, d.DriverInfo.SupportedSizeRange.Max = "64Mi", "1Gi"
	d.DriverInfo.SupportedFsType = map[string]struct{}{"": {}}
	d.DriverInfo.MaxFileSize = 1048576
	d.DriverInfo.Capabilities = map[string]bool{
		"persistence": isTrue(caps.Provision),
		"exec":        true,
		"fsGroup":     csidriver.Spec.FSGroupPolicy == nil || *csidriver.Spec.FSGroupPolicy != storagev1.NoneFSGroupPolicy,
		// flexd offers VOLUME_MOUNT_GROUP for a driver with fsGroup (FlexVolume default: true)
		// and applies the ownership itself; kubelet then leaves fsGroupChangePolicy aside.
		"volumeMountGroup":    notFalse(caps.FSGroup),
		"multipods":           true,
		"singleNodeVolume":    singleNode,
		"controllerExpansion": expands,
		"nodeExpansion":       expands,
		"onlineExpansion":     expands,
		"offlineExpansion":    expands,
		"block":               false,
		"snapshotDataSource":  false,
		"pvcDataSource":       false,
		"topology":            false,
		"RWX":                 false,
		"volumeLimits":        false,
		"capacity":            false,
		"readWriteOncePod":    false,
	}
	return d
}

// The last line of the suite's counts, and of its duration.
var (
	suiteCounts   = regexp.MustCompile(`(?m)^(?:SUCCESS|FAIL)! -- ([0-9]+) Passed \| ([0-9]+) Failed \| [0-9]+ Pending \| ([0-9]+) Skipped`)
	suiteDuration = regexp.MustCompile(`(?m)^Ran [0-9]+ of [0-9]+ Specs in ([0-9.]+) seconds`)
	suiteFailures = regexp.MustCompile(`^\s*\[FAIL\]|^  \[FAILED\]|Summarizing`)
)

// StorageSuite runs the suite against one definition (written to run/storage-LABEL.json) with
// ginkgo's CLI, E2E_STORAGE_PROCS (default 8) specs at a time (they mostly wait for pods and
// mounts, not on the CPU; [Serial] ones run alone at the end), its log in
// logs/storage-LABEL.log and its JUnit report next to it, and appends "storage LABEL: N passed,
// M failed, K skipped in S seconds" to logs/scenario-storage.summary (which run.sh prints). It
// returns the suite's error, if any, and shows the failures' lines.
func (c *Cluster) StorageSuite(ctx context.Context, label string, definition storageDefinition) error {
	ginkgo.GinkgoHelper()
	data, err := json.MarshalIndent(definition, "", "  ")
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	path := c.WriteRun("storage-"+label+".json", string(data)+"\n")
	fmt.Fprintf(ginkgo.GinkgoWriter, "%s:\n%s\n", path, data)

	logPath := c.Path("logs", "storage-"+label+".log")
	log, err := os.Create(logPath)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	defer log.Close()
	procs, timeout := os.Getenv("E2E_STORAGE_PROCS"), os.Getenv("E2E_STORAGE_TIMEOUT")
	if procs == "" {
		procs = "8"
	}
	if timeout == "" {
		timeout = "60m"
	}
	cmd := exec.CommandContext(ctx, c.Path("bin", "ginkgo"), "--procs", procs, "--focus", "External.Storage",
		"--skip", storageSkip, "--no-color", "--timeout", timeout,
		"--junit-report", c.Path("logs", "storage-"+label+".xml"), c.Path("bin", "storage-e2e.test"), "--",
		"-kubeconfig", c.Path("kubeconfig"), "-storage.testdriver", path)
	cmd.Stdout, cmd.Stderr = log, log
	ginkgo.By(fmt.Sprintf("the storage suite against %s (%s), %s at a time, its log in %s", label, definition.DriverInfo.Name, procs, logPath))
	suiteErr := cmd.Run()

	output := ReadFile(logPath)
	counts := "no summary"
	if all := suiteCounts.FindAllStringSubmatch(output, -1); len(all) > 0 {
		last := all[len(all)-1]
		counts = fmt.Sprintf("%s passed, %s failed, %s skipped", last[1], last[2], last[3])
	}
	duration := "?"
	if m := suiteDuration.FindStringSubmatch(output); m != nil {
		duration = m[1] + " seconds"
	}
	line := fmt.Sprintf("storage %s: %s in %s", label, counts, duration)
	summary, err := os.OpenFile(c.Path("logs", "scenario-storage.summary"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	_, err = fmt.Fprintln(summary, line)
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	gomega.Expect(summary.Close()).To(gomega.Succeed())
	fmt.Fprintln(ginkgo.GinkgoWriter, line)

	if suiteErr != nil {
		// The failures' lines and the two after each, as grep -A2 shows them, 60 lines at most.
		lines := strings.Split(output, "\n")
		var shown []string
		for i := 0; i < len(lines) && len(shown) < 60; i++ {
			if suiteFailures.MatchString(lines[i]) {
				end := min(i+3, len(lines))
				shown = append(shown, lines[i:end]...)
				i = end - 1
			}
		}
		fmt.Fprintln(ginkgo.GinkgoWriter, strings.Join(shown[:min(len(shown), 60)], "\n"))
		return fmt.Errorf("the storage suite against %s: %s (%w); its log: %s", label, counts, suiteErr, logPath)
	}
	return nil
}

// scenarioStorage: the suite against the two shapes of driver flexd serves: the builtin loop
// driver (attach, provision, expansion; its controller side is the manifests' Deployment with
// the real csi-attacher, csi-provisioner and csi-resizer) and the node-only hostdir driver (CSI
// inline ephemeral volumes). Zero failures in both, and flexd and the sidecars held on through
// both: no container of flexd's pods restarted. flexd's deployment with the loop driver stays
// (as deploy's does) for the scenarios after.
func scenarioStorage(ctx context.Context) {
	c := cluster
	gomega.Expect(os.Remove(c.Path("logs", "scenario-storage.summary"))).To(gomega.Or(gomega.Succeed(), gomega.MatchError(os.ErrNotExist)))

	ginkgo.By("the builtin loop driver installed, flexd deployed for every installed driver")
	c.MustFlexdEverywhere(ctx, "install", "--builtin", "loop", "--image-dir", c.SharedDir)
	c.ApplyAllManifests(ctx, "flexd-storage")
	c.ExpectControllerHardened(ctx, loopCSIName, "csi-attacher", "csi-provisioner", "csi-resizer")
	c.WaitCSINodeLists(ctx, loopCSIName)

	ginkgo.By("the suite's definitions of the two drivers, from `flexd drivers` and their CSIDrivers")
	loop := c.StorageDefinition(ctx, loopDriver, nil)
	hostdir := c.StorageDefinition(ctx, c.Driver, map[string]string{"volume": "e2e-storage-inline"})

	var failures []string
	for _, suite := range []struct {
		label      string
		definition storageDefinition
	}{{"loop", loop}, {"hostdir", hostdir}} {
		if err := c.StorageSuite(ctx, suite.label, suite.definition); err != nil {
			failures = append(failures, err.Error())
		}
	}

	ginkgo.By("no container of flexd's pods restarted during the suites")
	// An OOM kill, or a sidecar exiting on a lost connection to flexd, shows here.
	pods, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{})
	gomega.Expect(err).NotTo(gomega.HaveOccurred())
	for _, pod := range pods.Items {
		for _, status := range pod.Status.ContainerStatuses {
			if status.RestartCount > 0 {
				reason := "?"
				if status.LastTerminationState.Terminated != nil {
					reason = status.LastTerminationState.Terminated.Reason
				}
				failures = append(failures, fmt.Sprintf("restarted during the storage suite: %s/%s: %d restarts, last %s", pod.Name, status.Name, status.RestartCount, reason))
			}
		}
	}
	gomega.Expect(failures).To(gomega.BeEmpty(), "the storage suites and flexd's pods")
}
