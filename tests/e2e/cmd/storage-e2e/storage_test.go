// Package storagee2e is Kubernetes' storage end-to-end suite for external CSI drivers
// (k8s.io/kubernetes/test/e2e/storage/external), alone: the same framework, flags and specs as
// the full e2e.test, from the Kubernetes version the cluster runs, without the thousands of
// specs of the other areas. A driver is described by a test-driver definition file given with
// -storage.testdriver=FILE, which defines the specs; the usual Ginkgo flags select among them.
//
// Built by tests/e2e/tools.sh storage-e2e (`go test -c`), run by tests/e2e/run.sh storage. Built
// for every Kubernetes minor the e2e runs (tests/e2e/kubernetes/): where a release's framework
// differs, a file for each side is chosen by the before_1_N build tags tools.sh sets.
package storagee2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"k8s.io/component-base/logs"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"
	imageutils "k8s.io/kubernetes/test/utils/image"

	// define and freeze constants, as e2e.test does
	_ "k8s.io/kubernetes/test/e2e/feature"
	// the specs: every storage test suite, instantiated per -storage.testdriver file
	_ "k8s.io/kubernetes/test/e2e/storage/external"

	// reconfigure the framework as e2e.test does
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	// and, from 1.37, Gomega's formatting of Kubernetes objects (format_*.go)
)

// The images the suite's pods run, as this Kubernetes version names them: the cluster has no
// registry, so run.sh builds them under these names before the suite starts.
var printImages = flag.Bool("print-images", false, "print the images the storage specs' pods use (name and reference, a line each) and exit")

func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if *printImages {
		for _, image := range suiteImages {
			fmt.Printf("%s %s\n", image.name, imageutils.GetE2EImage(image.id))
		}
		os.Exit(0)
	}
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

// The part of e2e.test's suite set-up that applies to one node without cloud: the node must
// be schedulable and its system pods running before any spec starts.
var _ = ginkgo.SynchronizedBeforeSuite(func(ctx context.Context) []byte {
	c, err := framework.LoadClientset()
	framework.ExpectNoError(err, "a client for the cluster")
	framework.ExpectNoError(waitForSystemPods(ctx, c, framework.NewTimeoutContext().SystemPodsStartup))
	return nil
}, func(ctx context.Context, data []byte) {})

func TestStorage(t *testing.T) {
	logs.InitLogs()
	defer logs.FlushLogs()
	klog.EnableContextualLogging(true)
	gomega.RegisterFailHandler(framework.Fail)
	suiteConfig, reporterConfig := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "Kubernetes storage e2e suite for external drivers", suiteConfig, reporterConfig)
}
