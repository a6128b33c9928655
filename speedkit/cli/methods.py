"""``speedkit methods``: the speed-up methods, from their cards (a table, or one card as text or JSON)."""
from __future__ import annotations


def add_parser(commands) -> None:
    methods = commands.add_parser("methods", help="the speed-up methods, from their cards", allow_abbrev=False)
    methods.add_argument("--markdown", action="store_true", help="print the methods table as markdown")
    methods.add_argument("name", nargs="?", help="show one method's whole card")
    methods.add_argument("--json", action="store_true", help="with a name: the card as JSON")


def run(args) -> int:
    import json

    from speedkit.methods import REGISTRY, get_method, methods_table

    if args.name and args.json:
        print(json.dumps(get_method(args.name).CARD.to_dict(), indent=2, default=str))
    elif args.name:
        from speedkit.cli.show import method_card_text

        print(method_card_text(args.name))
    elif args.markdown:
        print(methods_table())
    else:
        for name, cls in REGISTRY.items():
            print(f"{name:<26} {cls.CARD.domain:<9} {cls.CARD.summary}")
    return 0
