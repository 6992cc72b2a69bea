// imageref reads image references, one a line, and judges each as the kubelet
// does before it pulls (parsers.ParseImageName: distribution/reference's
// ParseNormalizedNamed): "ok" or the parser's error, one a line.
package main

import (
	"bufio"
	// The digest algorithms the kubelet links in (go-digest takes only those).
	_ "crypto/sha256"
	_ "crypto/sha512"
	"fmt"
	"os"

	"github.com/distribution/reference"
)

func main() {
	lines := bufio.NewScanner(os.Stdin)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	for lines.Scan() {
		if _, err := reference.ParseNormalizedNamed(lines.Text()); err != nil {
			fmt.Println(err)
		} else {
			fmt.Println("ok")
		}
	}
}
