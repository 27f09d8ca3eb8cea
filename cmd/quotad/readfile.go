package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
	"time"

	"github.com/quotad/quotad/yamlbound"
)

// This file is how quotad reads every file it is given, at start and on
// reload: the --config file, the files of --envoy-config-dir (and the
// directory itself), TLS certificates, keys and CAs, the admin token, the
// cluster key and Redis' CA. A file is opened without waiting for a
// writer, so that a named pipe cannot hold quotad, and refused unless it
// is a regular file; what is read is bounded in bytes and in time.

const (
	// maxFileBytes is the most quotad reads of one file: 1 MiB, what one
	// Kubernetes ConfigMap or Secret holds in all, and so the longest YAML
	// text yamlbound.Parse takes.
	maxFileBytes = yamlbound.MaxBytes
	// fileReadTimeout is how long reading one file, or one
	// --envoy-config-dir directory's files in all, may take: far more than
	// a local disk needs, so that only a file system that does not answer
	// (a hung network mount) runs out of it.
	fileReadTimeout = 5 * time.Second
)

// readFile is readFileBy with fileReadTimeout from now.
func readFile(path string) ([]byte, error) {
	return readFileBy(path, time.Now().Add(fileReadTimeout))
}

// readFileBy returns the content of the regular file at path (symbolic
// links followed). It never waits for a writer: a named pipe, a socket, a
// device or a directory is refused ("<path> is a named pipe, not a
// regular file"), and so is a file of more than maxFileBytes. It returns
// by deadline in any case: a read that has not finished then is left to
// finish on its own goroutine, which closes the file, and the error says
// so. A missing or unreadable file is the *fs.PathError of os.Open.
func readFileBy(path string, deadline time.Time) ([]byte, error) {
	return within(path, deadline, func() ([]byte, error) {
		f, err := openKind(path, false)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
		if err != nil {
			return nil, err
		}
		if len(b) > maxFileBytes {
			return nil, errTooLarge(path)
		}
		return b, nil
	})
}

// readDirBy lists the directory at path, sorted by name, as readFileBy
// reads a file: what is not a directory is refused without waiting, and
// it returns by deadline.
func readDirBy(path string, deadline time.Time) ([]fs.DirEntry, error) {
	return within(path, deadline, func() ([]fs.DirEntry, error) {
		f, err := openKind(path, true)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return f.ReadDir(-1)
	})
}

// openKind opens path for reading without blocking on a named pipe
// (O_NONBLOCK: a pipe opens at once even with no writer, and is then
// refused), and returns it if it is a regular file (of at most
// maxFileBytes), or a directory when dir is set.
func openKind(path string, dir bool) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		// A socket does not open (ENXIO); say what it is.
		if st, statErr := os.Stat(path); statErr == nil && !st.Mode().IsRegular() && !st.IsDir() {
			return nil, errNotRegular(path, st.Mode(), dir)
		}
		return nil, err
	}
	st, err := f.Stat()
	switch {
	case err != nil:
	case dir && !st.IsDir():
		err = errNotRegular(path, st.Mode(), dir)
	case !dir && !st.Mode().IsRegular():
		err = errNotRegular(path, st.Mode(), dir)
	case !dir && st.Size() > maxFileBytes:
		err = errTooLarge(path)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// errNotRegular says what path is, instead of a regular file (or a
// directory, when dir is set).
func errNotRegular(path string, mode fs.FileMode, dir bool) error {
	want := "a regular file"
	if dir {
		want = "a directory"
	}
	is := "not " + want
	switch {
	case mode&fs.ModeNamedPipe != 0:
		is = "a named pipe"
	case mode&fs.ModeSocket != 0:
		is = "a socket"
	case mode&fs.ModeDevice != 0:
		is = "a device"
	case mode.IsDir():
		is = "a directory"
	case mode.IsRegular():
		is = "a regular file"
	}
	return fmt.Errorf("%s is %s, not %s", path, is, want)
}

func errTooLarge(path string) error {
	return fmt.Errorf("%s is larger than %d bytes (1 MiB), the most quotad reads of one file", path, maxFileBytes)
}

// errReadTimeout is the error of a read that did not finish by its
// deadline.
var errReadTimeout = errors.New("not read in time")

// within runs read on a goroutine of its own and returns what it returns,
// or, once deadline passes, an error naming path.
func within[T any](path string, deadline time.Time, read func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1) // the read never waits to hand its result over
	go func() {
		v, err := read()
		done <- result{v, err}
	}()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case r := <-done:
		return r.v, r.err
	case <-t.C:
		var zero T
		return zero, fmt.Errorf("%s: %w (%s allowed); is it on a file system that does not answer?", path, errReadTimeout, fileReadTimeout)
	}
}
