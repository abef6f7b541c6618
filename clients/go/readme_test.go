package redislock_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"redis-lock/clients/go/internal/testserver"
)

// The Go examples of README.md ("From Go") and clients/go/README.md: every complete program runs
// as written against a test server (its address in place of 127.0.0.1:6379), and every fragment
// compiles inside a program that gives it ctx, rdb and session.
func goBlocks(t *testing.T, path string) []string {
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	if strings.HasSuffix(path, "/README.md") && strings.Contains(text, "## From Go") {
		text = text[strings.Index(text, "## From Go"):]
		if i := strings.Index(text[3:], "\n## "); i >= 0 {
			text = text[:i+3]
		}
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(text, -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

const fragmentProgram = `package main

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
	redislock "redis-lock/clients/go"
)

var _ = fmt.Sprint

func main() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	session, serr := redislock.NewSession(ctx, rdb)
	_, _ = session, serr
`

var declared = regexp.MustCompile(`(?m)^\s*(\w+(?:, \w+)*) :?= `)

func TestReadmeExamples(t *testing.T) {
	if testing.Short() {
		t.Skip("builds programs")
	}
	ctx := testserver.Ctx(t, 240*time.Second)
	srv := testserver.New(t)
	rdb := srv.Client(t)
	blocks := append(goBlocks(t, "../../README.md"), goBlocks(t, "README.md")...)
	if len(blocks) < 4 {
		t.Fatalf("found %d Go blocks", len(blocks))
	}
	for _, code := range blocks {
		if !strings.HasPrefix(code, "package main") {
			var uses []string
			for _, m := range declared.FindAllStringSubmatch(code, -1) {
				for _, name := range strings.Split(m[1], ",") {
					if name = strings.TrimSpace(name); name != "_" {
						uses = append(uses, "\t_ = "+name+"\n")
					}
				}
			}
			testserver.GoProgram(t, ctx, fragmentProgram+code+strings.Join(uses, "")+"}\n", false)
			continue
		}
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(code, `"127.0.0.1:6379"`) {
			t.Fatalf("a program without the address to replace:\n%s", code)
		}
		out := testserver.GoProgram(t, ctx, strings.ReplaceAll(code, "127.0.0.1:6379", srv.Addr()), true)
		t.Logf("%s", out)
		if strings.Contains(out, "panic") {
			t.Fatalf("the program panicked:\n%s", out)
		}
	}
}
