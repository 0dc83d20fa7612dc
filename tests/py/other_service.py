"""Another service, written in Python with pymongo, on the collections a
mongo-patterns model declared: what tests/validation.rs runs as the
independent writer and reader (its own driver, its own encodings: Python
ints as int32 or int64, floats as double, dicts, datetimes).

    python3 tests/py/other_service.py write URI DB
        Tries each case below once and prints one JSON line per case:
        {"case", "coll", "expect", "stored", "code"}; a refused write's
        code is the server's (121: DocumentValidationFailure).
    python3 tests/py/other_service.py read URI DB COLL
        Prints the collection's documents as one canonical Extended JSON
        array, in `_id` order: what the Rust side stored, read by a driver
        that shares nothing with it.
"""

import datetime
import json
import sys

from bson import json_util
from pymongo import MongoClient
from pymongo.errors import WriteError

REFUSED, STORED = "refused", "stored"


def bucket(_id, count=1, start=0, items=None, customer=9):
    items = [{"at": i} for i in range(count)] if items is None else items
    return {"_id": _id, "customer": customer, "start": start, "count": count,
            "bytes": 0, "items": items}


def payment(_id, **fields):
    d = {"_id": _id, "method": {"Card": {"last4": "1", "exp": 2712}},
         "fee": {"kind": "waived"}, "hold": None, "refs": [1, "c", None], "channel": "Web"}
    d.update(fields)
    return d


# (collection, case, expected outcome, operation, argument): each refused
# case breaks one invariant the way a hand-written service does; each
# stored case is a document the library could have written itself.
CASES = [
    # A bucket (size 4, order "at": the limit is 8 with late items).
    ("trades", "bucket _id as a string", REFUSED, "insert", bucket("9_1700000000")),
    ("trades", "bucket _id without s", REFUSED, "insert", bucket({"k": 9})),
    ("trades", "count below 0", REFUSED, "insert", bucket({"k": 9, "s": 0}, count=-1, items=[])),
    ("trades", "count as a Python float", REFUSED, "insert", bucket({"k": 9, "s": 0}, count=1.0, items=[{"at": 0}])),
    ("trades", "count over the limit", REFUSED, "insert", bucket({"k": 9, "s": 0}, count=9)),
    ("trades", "items over the limit", REFUSED, "insert", bucket({"k": 9, "s": 0}, count=2, items=[{"at": i} for i in range(9)])),
    ("trades", "start below 0", REFUSED, "insert", bucket({"k": 9, "s": 0}, start=-1)),
    ("trades", "items missing", REFUSED, "insert", {"_id": {"k": 9, "s": 0}, "customer": 9, "start": 0, "count": 1}),
    ("trades", "an item's order field as text", REFUSED, "insert", bucket({"k": 9, "s": 0}, items=[{"at": "noon"}])),
    ("trades", "$inc past the limit", REFUSED, "update", ({"_id": {"k": 7, "s": 0}}, {"$inc": {"count": 20}})),
    ("trades", "a whole bucket as the library writes it", STORED, "insert",
     bucket({"k": 9, "s": 0}, count=2, items=[{"at": 3}, {"at": 4}])),
    # A histogram, both layouts.
    ("players_ranks", "a count below 0", REFUSED, "insert", {"_id": "art", "scores": [{"score": 1, "count": -1}]}),
    ("players_ranks", "a count as text", REFUSED, "insert", {"_id": "art", "scores": [{"score": 1, "count": "one"}]}),
    ("players_ranks", "a count as a Python float", REFUSED, "update",
     ({"_id": "math"}, {"$set": {"scores.0.count": 2.5}})),
    ("players_ranks", "scores missing", REFUSED, "insert", {"_id": "art"}),
    ("players_d_ranks", "a count below 0", REFUSED, "insert", {"_id": {"b": "art", "s": 1}, "count": -1}),
    ("players_d_ranks", "_id without the score", REFUSED, "insert", {"_id": {"b": "art"}, "count": 1}),
    ("players_d_ranks", "a flat _id", REFUSED, "insert", {"_id": "art:1", "count": 1}),
    # Players: the board and the score.
    ("players", "a score as text", REFUSED, "insert", {"_id": 100, "examId": "math", "score": "ninety"}),
    ("players", "a score as a Python float", REFUSED, "insert", {"_id": 101, "examId": "math", "score": 90.5}),
    ("players", "a board as a number", REFUSED, "insert", {"_id": 102, "examId": 7, "score": 90}),
    ("players", "a player as the library writes one", STORED, "insert", {"_id": 103, "examId": "history", "score": 70}),
    # A shard key's derived coarse field.
    ("logs", "the coarse field missing", REFUSED, "insert", {"_id": 100, "kind": "auth", "ts": 1700000000}),
    ("logs", "the coarse field as text", REFUSED, "insert", {"_id": 101, "kind": "auth", "ts": 1700000000, "month": "2023-11"}),
    ("logs", "a log as the library writes one", STORED, "insert",
     {"_id": 102, "kind": "auth", "ts": 1700000000,
      "month": datetime.datetime(2023, 11, 1, tzinfo=datetime.timezone.utc)}),
    # A keyset sort key: mixed types are what break keyset order.
    ("visits", "the sort key as text", REFUSED, "insert", {"initTime": "yesterday"}),
    ("visits", "the sort key as a Python float", REFUSED, "insert", {"initTime": 1.5}),
    ("visits", "tags as a string", REFUSED, "insert", {"tags": "a"}),
    ("visits", "a visit with a Python int and None", STORED, "insert", {"initTime": 6, "visitor": None, "tags": []}),
    # Enums with data, in each of serde's taggings (`#[derive(Schema)]`).
    ("payments", "a payment as serde stores one", STORED, "insert", payment(200)),
    ("payments", "a variant name serde never stores", REFUSED, "insert", payment(201, method="Crypto")),
    ("payments", "a newtype variant holding a Python float", REFUSED, "insert", payment(202, method={"Voucher": 7.0})),
    ("payments", "two variants in one", REFUSED, "insert", payment(203, method={"Cash": None, "Voucher": 1})),
    ("payments", "a tuple variant of the wrong length", REFUSED, "insert", payment(204, method={"Split": [1, 2, 3]})),
    ("payments", "no internal tag", REFUSED, "insert", payment(205, fee={"amountCents": 5})),
    ("payments", "adjacent content as text", REFUSED, "insert", payment(206, hold={"t": "Days", "c": "two"})),
    ("payments", "an untagged value of no variant", REFUSED, "insert", payment(207, refs=[1.5])),
]


def write(db):
    for coll, case, expect, op, arg in CASES:
        out = {"case": case, "coll": coll, "expect": expect}
        try:
            if op == "insert":
                db[coll].insert_one(arg)
            else:
                db[coll].update_one(*arg)
            out.update(stored=True, code=None)
        except WriteError as e:
            out.update(stored=False, code=e.code)
        print(json.dumps(out), flush=True)


def read(db, coll):
    docs = list(db[coll].find().sort("_id", 1))
    print(json_util.dumps(docs, json_options=json_util.CANONICAL_JSON_OPTIONS))


def main():
    mode, uri, name = sys.argv[1:4]
    db = MongoClient(uri, serverSelectionTimeoutMS=10000, timeoutMS=30000)[name]
    if mode == "write":
        write(db)
    elif mode == "read":
        read(db, sys.argv[4])
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
