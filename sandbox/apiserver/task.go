package main

import (
	"context"
	"time"

	"k8s.io/klog/v2"
)

// task is a component running in its own goroutine.
type task struct {
	name string
	done chan struct{} // closed when fn has returned
	err  error         // fn's result; read only after done is closed
}

func startTask(name string, fn func() error) *task {
	t := &task{name: name, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		t.err = fn()
	}()
	return t
}

func (t *task) finished() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// doneOrNever lets a disabled (nil) task sit in a select without firing.
func (t *task) doneOrNever() <-chan struct{} {
	if t == nil {
		return nil
	}
	return t.done
}

// stopTask cancels a task and waits up to timeout for it to return. A task
// that does not stop in time is abandoned: the process is exiting anyway.
func stopTask(t *task, cancel context.CancelFunc, timeout time.Duration) {
	if t == nil {
		return
	}
	cancel()
	select {
	case <-t.done:
		if t.err != nil {
			klog.ErrorS(t.err, "Component stopped with an error", "component", t.name)
		} else {
			klog.InfoS("Component stopped", "component", t.name)
		}
	case <-time.After(timeout):
		klog.InfoS("Component did not stop in time; abandoning it", "component", t.name, "timeout", timeout)
	}
}
