package main

import (
	"fmt"

	"google.golang.org/grpc/grpclog"
	"k8s.io/klog/v2"
)

// The apiserver routes gRPC's log into klog with warnings always shown. While
// it starts, it opens and drops dozens of etcd clients, each leaving a
// "createTransport failed ... operation was canceled" warning: about 65
// lines of noise per start. This logger (installed after the apiserver's,
// since package main initializes last) shows gRPC warnings only from -v=2
// on; errors still always show, and so do the apiserver's own storage errors.
func init() {
	grpclog.SetLoggerV2(quietGRPCLogger{})
}

type quietGRPCLogger struct{}

const grpcLogDepth = 2 // skip this wrapper and grpclog's own frame

func (quietGRPCLogger) Info(args ...any)                 { logGRPC(5, fmt.Sprint(args...)) }
func (quietGRPCLogger) Infoln(args ...any)               { logGRPC(5, fmt.Sprintln(args...)) }
func (quietGRPCLogger) Infof(format string, args ...any) { logGRPC(5, fmt.Sprintf(format, args...)) }
func (quietGRPCLogger) Warning(args ...any)              { logGRPC(2, fmt.Sprint(args...)) }
func (quietGRPCLogger) Warningln(args ...any)            { logGRPC(2, fmt.Sprintln(args...)) }
func (quietGRPCLogger) Warningf(format string, args ...any) {
	logGRPC(2, fmt.Sprintf(format, args...))
}
func (quietGRPCLogger) Error(args ...any)   { klog.ErrorDepth(grpcLogDepth, args...) }
func (quietGRPCLogger) Errorln(args ...any) { klog.ErrorDepth(grpcLogDepth, fmt.Sprintln(args...)) }
func (quietGRPCLogger) Errorf(format string, args ...any) {
	klog.ErrorDepth(grpcLogDepth, fmt.Sprintf(format, args...))
}

// gRPC's Fatal is documented to exit; keep that contract.
func (quietGRPCLogger) Fatal(args ...any)   { klog.FatalDepth(grpcLogDepth, args...) }
func (quietGRPCLogger) Fatalln(args ...any) { klog.FatalDepth(grpcLogDepth, fmt.Sprintln(args...)) }
func (quietGRPCLogger) Fatalf(format string, args ...any) {
	klog.FatalDepth(grpcLogDepth, fmt.Sprintf(format, args...))
}
func (quietGRPCLogger) V(level int) bool { return klog.V(klog.Level(level)).Enabled() }

func logGRPC(level klog.Level, msg string) {
	if v := klog.V(level); v.Enabled() {
		v.InfoSDepth(grpcLogDepth+1, msg)
	}
}
