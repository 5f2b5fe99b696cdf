"""moto's server with a fault-injection switchboard for tenon's AWS tests.

Everything is moto's own behaviour except what a test asks for through `/_fault/...`:

  POST /_fault/capacity   {"rules": [{"subnet_id": "subnet-1", "instance_type": "c5.large", "code": "InsufficientInstanceCapacity"}]}
      CreateFleet (type instant) skips the overrides matching a rule (same subnet, same type; an omitted
      instance_type matches every type) and reports each in the response's Errors[] with the rule's code,
      as EC2 does on HTTP 200. When no override is left, the fleet launches nothing.
  POST /_fault/spot-prices {"prices": {"g5.xlarge": {"us-east-1a": 0.4589}}}
      DescribeSpotPriceHistory answers these prices for those (type, zone) rows (moto's own are 0.00001).
  POST /_fault/pricing    {"products": [{"attributes": {"regionCode": "eu-west-1", "instanceType": "m5.large",
                           "tenancy": "Shared", ...}, "productFamily": "Compute Instance", "usd": "0.107"}]}
      The Pricing API, which moto lacks: GetProducts (AWSPriceListService, JSON 1.1) answers the products
      whose attributes match every TERM_MATCH filter, as PriceList JSON documents, paged by MaxResults.
  POST /_fault/ssm-parameters {"parameters": {"/aws/service/eks/optimized-ami/1.33/...": "ami-123"}}
      SSM GetParameter answers these names (public `/aws/service/...` parameters, which moto neither has
      nor lets a caller put); every other name goes to moto's SSM.
  POST /_fault/capacity-reservations {"reservations": [{"CapacityReservationId": "cr-1", "InstanceType": ...}]}
      DescribeCapacityReservations (which moto lacks) answers these reservations (EC2's field names), in
      the region they name (`Region`), by id or by the state, owner-id, instance-match-criteria, tag:K and
      tag-key filters.
  POST /_fault/instance-status {"statuses": {"i-1": {"InstanceStatus": "impaired", "SystemStatus": "ok",
                           "ImpairedSince": "2026-01-01T00:00:00Z", "Events": [{"Code": "system-reboot", ...}]}}}
      DescribeInstanceStatus reports these checks and scheduled events for those running instances (moto
      reports every check ok and knows no events), filtered by instance-status.status,
      system-status.status and event.code.
  GET  /_fault/actions?key=AKID
      The `service:Action` of every request signed with access key AKID (only keys starting `record-` are
      recorded), in order: what a test made, to hold against an IAM policy.
  POST /_fault/clear      {"subnet_ids": ["subnet-1"]}   removes the capacity rules of those subnets;
                          {"pricing_region": "eu-west-1"} removes that region's Pricing API products;
                          {} removes every rule, price, product and parameter.

Requests and answers of the APIs served here rather than by moto are checked against botocore's models of
them (the service definitions AWS publishes): a request or answer that does not fit is a 400 / 500 naming
the field, so the switchboard cannot drift from the real API.

Rules are scoped by subnet so that tests running in parallel, each in its own VPC, never see each
other's faults.

usage: python moto_faults.py HOST PORT
"""
import datetime
import io
import json
import sys
import threading

import botocore.session
from botocore.exceptions import ParamValidationError
from botocore.validate import validate_parameters

from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.ec2.models.fleets import Fleet
from moto.ec2.responses.fleets import Fleets
from moto.ec2.responses.spot_instances import SpotInstances

LOCK = threading.Lock()
CAPACITY_RULES = []  # dicts: subnet_id, instance_type (optional), code
SPOT_PRICES = {}  # instance type -> zone -> price
PRODUCTS = []  # Pricing API products: {"attributes": {...}, "productFamily": ..., "usd": "0.1"}
SSM_PARAMETERS = {}  # name -> value
RESERVATIONS = []  # DescribeCapacityReservations entries, with "Region"
STATUSES = {}  # instance id -> {"InstanceStatus", "SystemStatus", "ImpairedSince", "Events"}
ACTIONS = {}  # access key -> ["ec2:CreateFleet", ...]
MODELS = botocore.session.get_session()
CURRENT = threading.local()  # errors collected while one CreateFleet runs


def _rule_for(spec):
    with LOCK:
        for rule in CAPACITY_RULES:
            if rule.get("subnet_id") != spec.subnet_id:
                continue
            if rule.get("instance_type") not in (None, spec.instance_type):
                continue
            return rule
    return None


def _zone_of(fleet, spec):
    if not spec.subnet_id:
        return None
    return fleet.ec2_backend.get_subnet(spec.subnet_id).availability_zone


_original_counts = Fleet.get_launch_spec_counts


def _counts_without_faulted_specs(self, weight_to_add):
    errors = getattr(CURRENT, "errors", None)
    if errors is None:
        return _original_counts(self, weight_to_add)
    kept = []
    for spec in self.launch_specs:
        rule = _rule_for(spec)
        if rule is None:
            kept.append(spec)
            continue
        overrides = dict(spec.overrides or {})
        overrides.setdefault("InstanceType", spec.instance_type)
        overrides.setdefault("SubnetId", spec.subnet_id)
        zone = _zone_of(self, spec)
        if zone:
            overrides.setdefault("AvailabilityZone", zone)
        errors.append({
            "LaunchTemplateAndOverrides": {
                "LaunchTemplateSpecification": spec.launch_template_spec,
                "Overrides": overrides,
            },
            "Lifecycle": getattr(CURRENT, "lifecycle", "on-demand"),
            "ErrorCode": rule.get("code", "InsufficientInstanceCapacity"),
            "ErrorMessage": f"{rule.get('code', 'InsufficientInstanceCapacity')} for {spec.instance_type} in {zone} (injected by moto_faults.py)",
        })
    if not kept:
        return {}, 0.0
    all_specs = self.launch_specs
    self.launch_specs = kept
    try:
        return _original_counts(self, weight_to_add)
    finally:
        self.launch_specs = all_specs


Fleet.get_launch_spec_counts = _counts_without_faulted_specs


def _with_lifecycle(method, lifecycle):
    def wrapped(self, weight_to_add):
        CURRENT.lifecycle = lifecycle
        return method(self, weight_to_add)
    return wrapped


Fleet.create_spot_requests = _with_lifecycle(Fleet.create_spot_requests, "spot")
Fleet.create_on_demand_requests = _with_lifecycle(Fleet.create_on_demand_requests, "on-demand")

_original_create_fleet = Fleets.create_fleet


def _create_fleet_reporting_errors(self):
    CURRENT.errors = []
    try:
        result = _original_create_fleet(self)
        if CURRENT.errors and isinstance(result.result, dict):
            result.result["Errors"] = list(CURRENT.errors)
            result.result.setdefault("Instances", [])
        return result
    finally:
        CURRENT.errors = None


Fleets.create_fleet = _create_fleet_reporting_errors

_original_spot_history = SpotInstances.describe_spot_price_history


def _spot_history_with_prices(self):
    result = _original_spot_history(self)
    with LOCK:
        prices = {t: dict(z) for t, z in SPOT_PRICES.items()}
    if prices and isinstance(result.result, dict):
        for row in result.result.get("SpotPriceHistory", []):
            price = prices.get(row["InstanceType"], {}).get(row["AvailabilityZone"])
            if price is not None:
                row["SpotPrice"] = f"{price:.6f}"
    return result


SpotInstances.describe_spot_price_history = _spot_history_with_prices



class _Unfit(Exception):
    """A request the real API would refuse."""


def _ec2_error(code, message):
    from moto.ec2.exceptions import EC2ClientError
    print(f"moto_faults.py: refused: {code}: {message}", file=sys.stderr)
    return EC2ClientError(code, message)


def _ts(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _describe_capacity_reservations(self):
    ids = self._get_param("CapacityReservationIds", [])
    filters = self._filters_from_querystring()
    if ids and self._get_param("MaxResults") is not None:
        raise _ec2_error("InvalidParameterCombination", "MaxResults cannot be used with CapacityReservationIds")
    known = {"state", "owner-id", "instance-match-criteria", "tag-key"}
    for name in filters:
        if name not in known and not name.startswith("tag:"):
            raise _ec2_error("InvalidParameterValue", f"The filter '{name}' is invalid (moto_faults.py)")
    with LOCK:
        mine = [dict(r) for r in RESERVATIONS if r.get("Region", "us-east-1") == self.region]
    if ids:
        missing = [i for i in ids if i not in {r["CapacityReservationId"] for r in mine}]
        if missing:
            raise _ec2_error("InvalidCapacityReservationId.NotFound", f"The capacity reservation ID '{missing[0]}' does not exist")
        mine = [r for r in mine if r["CapacityReservationId"] in ids]
    def passes(r):
        tags = {t["Key"]: t["Value"] for t in r.get("Tags", [])}
        for name, values in filters.items():
            if name == "state" and r.get("State") not in values:
                return False
            if name == "owner-id" and r.get("OwnerId") not in values:
                return False
            if name == "instance-match-criteria" and r.get("InstanceMatchCriteria") not in values:
                return False
            if name == "tag-key" and not any(v in tags for v in values):
                return False
            if name.startswith("tag:") and tags.get(name[4:]) not in values:
                return False
        return True
    out = []
    for r in filter(passes, mine):
        r.pop("Region", None)
        for k in ("StartDate", "EndDate", "CreateDate"):
            if k in r:
                r[k] = _ts(r[k])
        out.append(r)
    answer = {"CapacityReservations": out}
    _check_answer("ec2", "DescribeCapacityReservations", answer)
    return ActionResult(answer)


def _describe_instance_status(self):
    ids = self._get_param("InstanceIds", [])
    filters = self._filters_from_querystring()
    for name in filters:
        if name not in ("instance-status.status", "system-status.status", "event.code"):
            raise _ec2_error("InvalidParameterValue", f"The filter '{name}' is invalid (moto_faults.py)")
    instances = self.ec2_backend.describe_instance_status(ids, False, [])
    with LOCK:
        statuses = {k: dict(v) for k, v in STATUSES.items()}
    out = []
    for i in instances:
        s = statuses.get(i.id, {})
        since = _ts(s["ImpairedSince"]) if "ImpairedSince" in s else None
        def check(status):
            details = [{"Name": "reachability", "Status": "failed" if status == "impaired" else "passed"}]
            if status == "impaired" and since is not None:
                details[0]["ImpairedSince"] = since
            return {"Status": status, "Details": details}
        events = [dict(e, NotBefore=_ts(e["NotBefore"])) if "NotBefore" in e else dict(e) for e in s.get("Events", [])]
        entry = {
            "InstanceId": i.id,
            "AvailabilityZone": i.availability_zone,
            "InstanceState": {"Code": 16, "Name": "running"},
            "InstanceStatus": check(s.get("InstanceStatus", "ok")),
            "SystemStatus": check(s.get("SystemStatus", "ok")),
            "Events": events,
        }
        if "instance-status.status" in filters and entry["InstanceStatus"]["Status"] not in filters["instance-status.status"]:
            continue
        if "system-status.status" in filters and entry["SystemStatus"]["Status"] not in filters["system-status.status"]:
            continue
        if "event.code" in filters and not any(e.get("Code") in filters["event.code"] for e in events):
            continue
        out.append(entry)
    answer = {"InstanceStatuses": out}
    _check_answer("ec2", "DescribeInstanceStatus", answer)
    return ActionResult(answer)


from moto.core.responses import ActionResult  # noqa: E402
from moto.ec2.responses import EC2Response  # noqa: E402

EC2Response.describe_capacity_reservations = _describe_capacity_reservations
EC2Response.describe_instance_status = _describe_instance_status

MOTO = DomainDispatcherApplication(create_backend_app)


def _operation(service, name):
    return MODELS.get_service_model(service).operation_model(name)


def _json_answer(start_response, status, body):
    start_response(status, [("Content-Type", "application/x-amz-json-1.1")])
    return [json.dumps(body).encode()]


def _json_error(start_response, status, code, message):
    return _json_answer(start_response, status, {"__type": code, "message": message})


def _checked(service, operation, request):
    """The request's parameters, checked against the operation's input shape (ParamValidationError)."""
    validate_parameters(request, _operation(service, operation).input_shape)
    return request


def _check_answer(service, operation, answer):
    try:
        validate_parameters(answer, _operation(service, operation).output_shape)
    except ParamValidationError as e:
        print(f"moto_faults.py: an answer to {operation} does not fit its model: {e}", file=sys.stderr)
        raise
    return answer


def _price_list_entry(product):
    """One product as the Pricing API's PriceList documents it (a JSON document in a string)."""
    sku = "SKU" + str(abs(hash(json.dumps(product, sort_keys=True))) % 10**12)
    attributes = {k: v for k, v in product["attributes"].items() if k not in ("productFamily", "serviceCode")}
    return json.dumps({
        "product": {"productFamily": product["productFamily"], "attributes": attributes, "sku": sku},
        "serviceCode": "AmazonEC2",
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
            "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                "unit": "Hrs", "endRange": "Inf", "beginRange": "0", "appliesTo": [],
                "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7", "description": "per On Demand Linux Instance Hour",
                "pricePerUnit": {"USD": product["usd"]}}},
            "sku": sku, "effectiveDate": "2026-07-01T00:00:00Z", "offerTermCode": "JRTCKXETXF", "termAttributes": {}}}},
        "version": "20260720000000",
        "publicationDate": "2026-07-20T00:00:00Z",
    })


def _get_products(request):
    if request.get("ServiceCode") != "AmazonEC2":
        return []
    def matches(product):
        fields = dict(product["attributes"], productFamily=product["productFamily"], serviceCode="AmazonEC2")
        for f in request.get("Filters", []):
            if f["Type"] != "TERM_MATCH" or fields.get(f["Field"]) != f["Value"]:
                return False
        return True
    with LOCK:
        return [_price_list_entry(p) for p in PRODUCTS if matches(p)]


def _aws_json(environ, start_response, target):
    """Pricing GetProducts and the registered SSM parameters; None hands the request to moto."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    raw = environ["wsgi.input"].read(length)
    try:
        request = json.loads(raw or b"{}")
    except ValueError as e:
        return None, raw
    try:
        if target == "AWSPriceListService.GetProducts":
            _checked("pricing", "GetProducts", request)
            entries = _get_products(request)
            start = int(request.get("NextToken") or 0)
            size = request.get("MaxResults") or 100
            answer = {"FormatVersion": "aws_v1", "PriceList": entries[start:start + size]}
            if start + size < len(entries):
                answer["NextToken"] = str(start + size)
            return _json_answer(start_response, "200 OK", _check_answer("pricing", "GetProducts", answer)), raw
        if target == "AmazonSSM.GetParameter":
            _checked("ssm", "GetParameter", request)
            with LOCK:
                value = SSM_PARAMETERS.get(request["Name"])
            if value is None:
                return None, raw
            answer = {"Parameter": {
                "Name": request["Name"], "Type": "String", "Value": value, "Version": 1,
                "LastModifiedDate": datetime.datetime(2026, 7, 20, tzinfo=datetime.timezone.utc),
                "ARN": f"arn:aws:ssm:us-east-1::parameter{request['Name']}", "DataType": "aws:ec2:image",
            }}
            _check_answer("ssm", "GetParameter", answer)
            answer["Parameter"]["LastModifiedDate"] = answer["Parameter"]["LastModifiedDate"].timestamp()
            return _json_answer(start_response, "200 OK", answer), raw
    except ParamValidationError as e:
        print(f"moto_faults.py: refused {target}: {e}", file=sys.stderr)
        return _json_error(start_response, "400 Bad Request", "ValidationException", f"moto_faults.py: {e}"), raw
    return None, raw


def _fault(environ, start_response):
    length = int(environ.get("CONTENT_LENGTH") or 0)
    try:
        body = json.loads(environ["wsgi.input"].read(length) or b"{}")
    except ValueError as e:
        start_response("400 Bad Request", [("Content-Type", "text/plain")])
        return [f"bad JSON: {e}".encode()]
    path = environ.get("PATH_INFO", "")
    with LOCK:
        if path == "/_fault/capacity":
            CAPACITY_RULES.extend(body.get("rules", []))
        elif path == "/_fault/spot-prices":
            for itype, zones in body.get("prices", {}).items():
                SPOT_PRICES.setdefault(itype, {}).update(zones)
        elif path == "/_fault/pricing":
            PRODUCTS.extend(body.get("products", []))
        elif path == "/_fault/ssm-parameters":
            SSM_PARAMETERS.update(body.get("parameters", {}))
        elif path == "/_fault/capacity-reservations":
            RESERVATIONS.extend(body.get("reservations", []))
        elif path == "/_fault/instance-status":
            STATUSES.update(body.get("statuses", {}))
        elif path == "/_fault/clear" and "pricing_region" in body:
            PRODUCTS[:] = [p for p in PRODUCTS if p["attributes"].get("regionCode") != body["pricing_region"]]
        elif path == "/_fault/clear":
            subnets = body.get("subnet_ids")
            if subnets is None:
                CAPACITY_RULES.clear()
                SPOT_PRICES.clear()
                PRODUCTS.clear()
                SSM_PARAMETERS.clear()
                RESERVATIONS.clear()
                STATUSES.clear()
            else:
                CAPACITY_RULES[:] = [r for r in CAPACITY_RULES if r.get("subnet_id") not in subnets]
        else:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"unknown fault endpoint"]
        state = {"capacity_rules": len(CAPACITY_RULES), "spot_prices": sum(len(z) for z in SPOT_PRICES.values())}
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps(state).encode()]


def _record(environ):
    """Notes the `service:Action` of a request signed with a `record-` key; the body is read and put back."""
    auth = environ.get("HTTP_AUTHORIZATION", "")
    if "Credential=record-" not in auth:
        return
    scope = auth.split("Credential=", 1)[1].split(",", 1)[0].split("/")
    if len(scope) < 4:
        return
    key, service = scope[0], scope[3]
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    action = None
    if target:
        action = target.split(".", 1)[-1]
    elif service == "eks":
        method, path = environ.get("REQUEST_METHOD"), environ.get("PATH_INFO", "")
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["clusters"]:
            action = {("GET", 2): "DescribeCluster", ("GET", 1): "ListClusters", ("POST", 1): "CreateCluster"}.get((method, len(parts)))
    else:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        raw = environ["wsgi.input"].read(length)
        environ["wsgi.input"] = io.BytesIO(raw)
        from urllib.parse import parse_qs
        query = parse_qs(raw.decode("utf-8", "replace")) or parse_qs(environ.get("QUERY_STRING", ""))
        action = (query.get("Action") or [None])[0]
    with LOCK:
        ACTIONS.setdefault(key, []).append(f"{service}:{action or '?'}")


def app(environ, start_response):
    path = environ.get("PATH_INFO", "")
    if path == "/_fault/actions":
        from urllib.parse import parse_qs
        key = (parse_qs(environ.get("QUERY_STRING", "")).get("key") or [""])[0]
        with LOCK:
            body = json.dumps(ACTIONS.get(key, [])).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]
    if path.startswith("/_fault/"):
        return _fault(environ, start_response)
    _record(environ)
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    if target in ("AWSPriceListService.GetProducts", "AmazonSSM.GetParameter"):
        answered, raw = _aws_json(environ, start_response, target)
        if answered is not None:
            return answered
        # Not ours: moto reads the body again.
        environ["wsgi.input"] = io.BytesIO(raw)
        environ["CONTENT_LENGTH"] = str(len(raw))
    return MOTO(environ, start_response)


if __name__ == "__main__":
    run_simple(sys.argv[1], int(sys.argv[2]), app, threaded=True)
