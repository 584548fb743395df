// Command orders-enqueue asks for the payment of orders, as the service's
// application code would: orders-enqueue --redis 127.0.0.1:6379 42:1999 43:500
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/hibiken/asynq"

	"example.com/orders"
)

func main() {
	addr := flag.String("redis", "127.0.0.1:6379", "the Redis the workers serve")
	flag.Parse()
	client := asynq.NewClient(asynq.RedisClientOpt{Addr: *addr})
	defer client.Close()
	for _, arg := range flag.Args() {
		id, cents, ok := strings.Cut(arg, ":")
		n, err := strconv.ParseInt(cents, 10, 64)
		if !ok || err != nil {
			fmt.Fprintf(os.Stderr, "orders-enqueue: %q: want ORDER_ID:AMOUNT_CENTS\n", arg)
			os.Exit(2)
		}
		info, err := orders.Enqueue(context.Background(), client, orders.PayOrder{OrderID: id, AmountCents: n})
		if errors.Is(err, asynq.ErrTaskIDConflict) {
			fmt.Printf("pay:%s already queued\n", id)
			continue
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "orders-enqueue: %s: %v\n", arg, err)
			os.Exit(1)
		}
		fmt.Println(info.ID)
	}
}
