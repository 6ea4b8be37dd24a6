//go:build !controlplane

package main

import (
	"context"

	"k8s.io/component-base/cli"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// The real node of the e2e tests (tests/testcluster's RealNode runs it inside namespaces of
// its own).
func init() {
	optional["kubelet"] = func(args []string) int {
		cmd := kubelet.NewKubeletCommand(context.Background())
		cmd.SetArgs(args)
		return cli.Run(cmd)
	}
}
