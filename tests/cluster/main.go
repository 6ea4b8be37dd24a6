// Command ktest is the test control plane for nodewright's end-to-end tests: one
// multi-call binary that runs an embedded etcd, kube-apiserver or kube-controller-manager
// (each as its own process: their global state allows one per process), built from the
// upstream Kubernetes modules, plus a helper that writes the certificates they need.
// A cluster with real nodes also runs kube-scheduler and a kubelet per node.
//
//	ktest certs --dir DIR [--host 127.0.0.1]
//	ktest etcd --data-dir DIR --client-url http://127.0.0.1:P --peer-url http://127.0.0.1:Q
//	ktest kube-apiserver [flags...]
//	ktest kube-controller-manager [flags...]
//	ktest kube-scheduler [flags...]
//	ktest kubectl [args...]
//	ktest kubelet [flags...]
//
// Test tooling only: nothing here ships.
package main

import (
	"context"
	"fmt"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	kubectl "k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/plugin"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: ktest certs|etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubectl|kubelet [flags]")
		os.Exit(2)
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "certs":
		os.Exit(runCerts(args))
	case "etcd":
		os.Exit(runEtcd(args))
	case "kube-apiserver":
		cmd := apiserver.NewAPIServerCommand()
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	case "kube-controller-manager":
		cmd := controllermanager.NewControllerManagerCommand()
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	case "kube-scheduler":
		// Places the pods of a cluster with real nodes (a Deployment's replicas spread by
		// the chart's anti-affinity); the simulated-node clusters bind nothing.
		cmd := scheduler.NewSchedulerCommand()
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	case "kubelet":
		// The real node of the e2e tests (tests/testcluster's RealNode runs it inside
		// namespaces of its own).
		cmd := kubelet.NewKubeletCommand(context.Background())
		cmd.SetArgs(args)
		os.Exit(cli.Run(cmd))
	case "kubectl":
		// As the real kubectl does, including plugins: `ktest kubectl nodewright status`
		// runs `kubectl-nodewright status` from the PATH.
		streams := genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
		cmd := kubectl.NewDefaultKubectlCommandWithArgs(kubectl.KubectlOptions{
			PluginHandler: kubectl.NewDefaultPluginHandler(plugin.ValidPluginFilenamePrefixes),
			Arguments:     append([]string{"kubectl"}, args...),
			ConfigFlags:   genericclioptions.NewConfigFlags(true).WithDiscoveryBurst(300).WithDiscoveryQPS(50.0).WithWarningPrinter(streams),
			IOStreams:     streams,
		})
		cmd.SetArgs(args)
		if err := cli.RunNoErrOutput(cmd); err != nil {
			kubectlutil.CheckErr(err)
		}
		os.Exit(0)
	default:
		fmt.Fprintf(os.Stderr, "ktest: unknown component %q\n", os.Args[1])
		os.Exit(2)
	}
}
