"""Test helper process: append numbered records to one partition forever, printing
"<base_offset> <first_number> <count>" after each append returns.

Usage: python writer.py ROOT TOPIC WRITER_ID [segment_bytes]
"""

from __future__ import annotations

import sys

import logkit


def main() -> None:
    root, topic_name, writer_id = sys.argv[1], sys.argv[2], sys.argv[3]
    config = {"segment.bytes": int(sys.argv[4])} if len(sys.argv) > 4 else None
    with logkit.Broker(root, background=False) as broker:
        try:
            topic = broker.create_topic(topic_name, 1, config=config)
        except logkit.TopicExistsError:
            topic = broker.topic(topic_name)
        partition = topic.partition(0)
        number = 0
        print("ready", flush=True)
        while True:
            count = 1 + number % 17
            rows = [(writer_id.encode(), b"%s-%d" % (writer_id.encode(), number + i) * 3,
                     None, None) for i in range(count)]
            base = partition.append(rows)
            print(base, number, count, flush=True)
            number += count


if __name__ == "__main__":
    main()
