package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// runEtcd runs an embedded, single-member etcd on loopback until SIGTERM/SIGINT.
func runEtcd(args []string) int {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "data directory (required)")
	clientURL := fs.String("client-url", "http://127.0.0.1:2379", "client URL")
	peerURL := fs.String("peer-url", "http://127.0.0.1:2380", "peer URL")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	client, err := url.Parse(*clientURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: --client-url: %v\n", err)
		return 2
	}
	peer, err := url.Parse(*peerURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: --peer-url: %v\n", err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// Tests do not need durability; fsync dominates etcd latency on shared disks.
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "error"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Println("etcd ready")
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	case <-time.After(60 * time.Second):
		fmt.Fprintln(os.Stderr, "etcd: not ready after 60s")
		return 1
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-stop:
		return 0
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
}
